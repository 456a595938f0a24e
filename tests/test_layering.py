"""The apps' boundaries (core <- registry <- serving <- the MLflow app and
observability; sso on core alone) and serving's own layers (entry points >
services > worker > replica calls, door, volume > pure modules) are
import-linter contracts in pyproject.toml ([tool.importlinter]); this runs them
in every `make test`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_import_contract_is_kept():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_contract_is_reported(tmp_path):
    # Proves the contracts above look at this code: registry does import core.
    config = tmp_path / "importlinter.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    core\n    registry\n\n"
        "[importlinter:contract:upside-down]\nname = registry never imports core\n"
        "type = forbidden\nsource_modules = registry\nforbidden_modules = core\n"
    )
    result = lint_imports("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "registry is not allowed to import core" in result.stdout


def serving_layers() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and c.get("containers") == ["serving"]
    ]
    return contract


def test_serving_layers_upside_down_are_broken(tmp_path):
    # Proves serving's layers contract looks at this code: the same layers in
    # reverse order must fail, naming an import that goes down the real order.
    contract = serving_layers()
    assert len(contract["layers"]) >= 5
    config = tmp_path / "importlinter.ini"
    layers = "".join(f"    {layer}\n" for layer in reversed(contract["layers"]))
    config.write_text(
        "[importlinter]\nroot_packages =\n    serving\n\n"
        "[importlinter:contract:inverted]\nname = serving upside down\ntype = layers\n"
        f"containers =\n    serving\nlayers =\n{layers}"
    )
    result = lint_imports("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "serving upside down BROKEN" in result.stdout
    # The worker's engine does import its steps: reversed, that is refused.
    assert "serving.rollouts.engine -> serving.rollouts.steps" in result.stdout, result.stdout
