"""The documentation builds, its links resolve, and it keeps up with the code.

MkDocs checks the pages under docs/ itself: mkdocs.yml turns a page missing
from the nav, a link to a missing page or heading, and an absolute link into
warnings, and --strict turns warnings into errors. The README is not part of
the site, so its links are checked here, against the same heading ids.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "operators" / "configuration.md"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXPLICIT_ID = re.compile(r"\{#([\w-]+)\}|\bid=\"([\w-]+)\"")
FIGURES_MARK = re.compile(r"<!-- figures:([\w-]+):(start|end) -->")


def without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def heading_text(raw: str) -> str:
    """What a heading renders to: no code ticks, emphasis or link targets."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", text).replace("`", "")


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Heading ids as MkDocs makes them (and GitHub, which renders the README)."""
    text = without_code_blocks(path.read_text())
    ids = set()
    for raw in HEADING.findall(text):
        shown = heading_text(EXPLICIT_ID.sub("", raw)).strip()
        ids.add(slugify(shown, "-"))
        ids.add(github_slug(shown))
    ids.update(a or b for a, b in EXPLICIT_ID.findall(text))
    return ids


def relative_links(path: Path) -> list[str]:
    links = LINK.findall(without_code_blocks(path.read_text()))
    return [link for link in links if not re.match(r"^[a-z][a-z+.-]*:", link)]


def test_the_site_builds_with_no_warning(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "operators" / "configuration" / "index.html").is_file()


@pytest.mark.parametrize("link", relative_links(README))
def test_every_readme_link_resolves(link):
    target, _, anchor = link.partition("#")
    path = (ROOT / target) if target else README
    assert path.exists(), f"README.md links to {target}, which does not exist"
    if anchor:
        assert path.suffix == ".md", f"{link}: an anchor into a file that is not markdown"
        assert anchor in anchors_of(path), f"{link}: {target or 'README.md'} has no #{anchor}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Real heading\n\n[ok](#real-heading) [bad](#no-heading)\n")
    assert relative_links(page) == ["#real-heading", "#no-heading"]
    assert "real-heading" in anchors_of(page)
    assert "no-heading" not in anchors_of(page)


def test_the_readme_fits_on_a_few_screens():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


REPOSITORY_FOLDERS = {
    "bench",
    "clients",
    "config",
    "core",
    "deploy",
    "docs",
    "mlflow_bridge",
    "notifications",
    "observability",
    "registry",
    "scripts",
    "serving",
    "sso",
    "static",
    "templates",
    "tests",
}


def repository_paths_named(path: Path) -> list[str]:
    """Paths like `serving/gate.py` a page names in code spans (not placeholders)."""
    spans = re.findall(r"`([^`\s]+)`", without_code_blocks(path.read_text()))
    return [
        span.rstrip(",.:;)")
        for span in spans
        if "/" in span
        and span.split("/")[0] in REPOSITORY_FOLDERS
        and not re.search(r"[<>*…{}$]", span)
    ]


@pytest.mark.parametrize(
    "page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda page: str(page.relative_to(ROOT))
)
def test_every_file_a_page_names_exists(page):
    missing = [name for name in repository_paths_named(page) if not (ROOT / name).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names files that are not there: {missing}"


def settings_read_from_the_environment() -> set[str]:
    """Every variable name the settings read, by the helpers of config/env.py."""
    call = re.compile(
        r"\b(?:secret|integer|number|boolean|choice|url_with_scheme|str|list|int|bool|float)"
        r"\(\s*\"([A-Z][A-Z0-9_]+)\""
    )
    constant = re.compile(r"^\w+_ENV\s*=\s*\"([A-Z][A-Z0-9_]+)\"", re.MULTILINE)
    names = set()
    for path in [*ROOT.glob("config/*.py"), ROOT / "sso" / "conf.py"]:
        text = path.read_text()
        names.update(call.findall(text), constant.findall(text))
    return names


def test_every_setting_is_on_the_configuration_page():
    names = settings_read_from_the_environment()
    assert {"DATABASE_URL", "SERVING_CLAIM_SECONDS", "OIDC_ISSUER", "WORKER_LIVENESS_FILE"} <= names
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", CONFIGURATION.read_text()))
    missing = sorted(names - documented)
    assert not missing, f"not in docs/operators/configuration.md: {', '.join(missing)}"


def figure_blocks(path: Path) -> list[str]:
    """Names of the blocks scripts/figures.py rewrites; each opened and closed once."""
    marks = FIGURES_MARK.findall(path.read_text())
    names = [name for name, edge in marks if edge == "start"]
    assert marks == [(name, edge) for name in names for edge in ("start", "end")], (
        f"{path.name}: figure blocks must open and close in turn, never nest"
    )
    assert len(names) == len(set(names)), f"{path.name}: a figure block appears twice"
    return names


def test_figure_blocks_are_where_the_figures_script_looks():
    assert figure_blocks(README) == ["summary"]
    assert set(figure_blocks(DOCS / "figures.md")) >= {
        "promote_to_served",
        "scale",
        "scale_promotions",
        "many_adapters",
        "new_pod_to_served",
        "upload_throughput",
        "swap_under_traffic",
        "fingerprint_spread",
        "lora_pool_memory",
        "tensor_values",
        "faults",
    }
