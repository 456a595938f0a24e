"""mypy with django-stubs and djangorestframework-stubs over every app and config/
([tool.mypy] in pyproject.toml), in every `make test`. Its cache lives in the
system's temporary folder, so a run after the first checks only what changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MYPY = Path(sys.executable).with_name("mypy")
# The checkout's own cache: one shared in /tmp by several checkouts of another
# state gave false errors (the Django plugin does not re-check a file when only
# the settings change).
CACHE = ROOT / ".mypy_cache"


def mypy(*args: str) -> subprocess.CompletedProcess:
    # The Django plugin imports the settings: a debug key suffices to read them.
    env = {**os.environ, "DJANGO_DEBUG": "true", "DJANGO_SECRET_KEY": "mypy-only"}
    env.pop("PROCESS_ROLE", None)
    return subprocess.run(
        [str(MYPY), "--cache-dir", str(CACHE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # Cold, over every app, niced beside the heavy run: minutes, not seconds.
        timeout=900,
    )


def test_every_app_type_checks():
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_a_type_error_is_reported(tmp_path):
    # Proves the check looks at code with the plugin on: a model field's type is known.
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from serving.models import Deployment\n\n"
        "def name_length(deployment: Deployment) -> int:\n"
        "    return deployment.name\n"
    )
    result = mypy(str(wrong))
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Incompatible return value type (got "str", expected "int")' in result.stdout
