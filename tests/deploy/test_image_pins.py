"""What the images install, pinned: the base image a build argument defaulting to
the public image, HAProxy at the version the front door's tests run, and every
Python package at the version of deploy/docker/constraints.txt. The compose tier
(tests/compose) builds the images and checks the same inside them."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "Dockerfile": "python:3.11-slim-bookworm",
    "deploy/docker/vllm-cpu.Dockerfile": "python:3.11-slim-bookworm",
}
PRODUCT_PACKAGES = [
    "config",
    "core",
    "registry",
    "serving",
    "sso",
    "observability",
    "mlflow_bridge",
]


def constraints() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "deploy/docker/constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        assert version, f"constraints.txt: {line!r} is not name==version"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def requirements() -> list[Requirement]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [Requirement(x.split("#", 1)[0]) for x in lines if x.split("#", 1)[0].strip()]


@pytest.mark.parametrize("path", sorted(DOCKERFILES))
def test_each_dockerfile_starts_from_a_base_argument_defaulting_to_the_public_image(path):
    text = (REPO / path).read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms == ["${BASE_IMAGE}"], froms
    assert re.search(rf"^ARG BASE_IMAGE={re.escape(DOCKERFILES[path])}$", text, re.M)


def test_every_requirement_is_pinned_within_its_range():
    pins = constraints()
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (requirements.txt) has no pin in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req.name}=={pins[name]} (constraints.txt) is outside {req} (requirements.txt)"
        )


def closure() -> set[str]:
    """What `pip install -r requirements.txt` installs, from the installed
    packages' own metadata (this venv has them all): names, canonical."""
    seen: set[str] = set()
    todo = [(r, "") for r in requirements()]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            wanted = [e for e in req.extras if sub.marker and sub.marker.evaluate({"extra": e})]
            if sub.marker and not sub.marker.evaluate({"extra": ""}) and not wanted:
                continue
            todo.append((sub, wanted[0] if wanted else ""))
    return {n for n in seen if "[" not in n}


def test_every_package_requirements_txt_installs_is_pinned():
    unpinned = closure() - set(constraints())
    assert not unpinned, f"installed from requirements.txt but not in constraints.txt: {unpinned}"


def _third_party_imports() -> set[str]:
    local = {p.name for p in REPO.iterdir() if p.is_dir()} | {"manage"}
    found = set()
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found |= {n.split(".")[0] for n in names}
    return {n for n in found if n not in sys.stdlib_module_names and n not in local}


def test_every_package_the_product_imports_is_in_the_image():
    # numpy was imported (registry/ingest/tensor_values.py) but came into the
    # test venv only through other packages: the image's collectstatic failed.
    installed = closure()
    by_module = metadata.packages_distributions()
    missing = {}
    for module in sorted(_third_party_imports()):
        dists = {canonicalize_name(d) for d in by_module.get(module, [])}
        assert dists, f"{module}: imported by the product but installed by no package"
        if not dists & installed:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not installed in the image (requirements.txt): {missing}"


def test_haproxy_in_the_image_is_the_version_the_door_tests_run():
    text = (REPO / "Dockerfile").read_text()
    pinned = re.search(r"^ARG HAPROXY_VERSION=(\S+)$", text, re.M)
    assert pinned, "the Dockerfile pins no HAProxy version"
    assert '"haproxy=${HAPROXY_VERSION}"' in text
    assert pinned.group(1) == "2.6.*"
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        if os.environ.get("REQUIRE_HAPROXY") == "1":
            pytest.fail("haproxy is required (scripts/test.sh installs it)")
        pytest.skip("haproxy not installed (scripts/test.sh installs it)")
    banner = subprocess.run([haproxy, "-v"], capture_output=True, text=True, check=True).stdout
    assert re.match(r"HA-?Proxy version 2\.6\.", banner), banner


def test_the_build_context_leaves_out_the_secrets_and_local_state():
    ignored = (REPO / ".dockerignore").read_text().split()
    for path in ("secrets/", "var/", ".venv", ".git"):
        assert path in ignored, f"COPY . . would take {path} into the image"
