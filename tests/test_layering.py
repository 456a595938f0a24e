"""The apps' boundaries (core <- registry <- serving <- the MLflow app and
observability; sso on core alone) are import-linter contracts in pyproject.toml
([tool.importlinter]); this runs them in every `make test`."""

from __future__ import annotations

import subprocess
import sys
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
