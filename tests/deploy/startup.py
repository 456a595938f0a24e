"""Loads config/settings.py as each deployed process would, many environments in
one interpreter (a process per case costs seconds each): whether it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETTINGS_EACH = """
import json, os, runpy, sys
from django.core.exceptions import ImproperlyConfigured
results = []
for env in json.load(sys.stdin):
    os.environ.clear()
    os.environ.update(env)
    try:
        results.append(runpy.run_path("config/settings.py")["PROCESS_ROLE"])
    except ImproperlyConfigured as error:
        results.append("error: " + str(error))
print(json.dumps(results))
"""


def settings_started(environments: list[dict]) -> list[str]:
    """Per environment, the PROCESS_ROLE settings started as, or "error: ..."."""
    result = subprocess.run(
        [sys.executable, "-c", SETTINGS_EACH],
        cwd=REPO,
        input=json.dumps(environments),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout)
