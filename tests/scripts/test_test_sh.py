"""scripts/test.sh under CI=true refuses to drop a tier before anything is
installed or run (the install and tool checks after this fail the same way,
through the same `cannot_run`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POSTGRES = "postgres://postgres@127.0.0.1:5432/unused"


def run_test_sh(**env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CI"}}
    return subprocess.run(
        ["bash", "scripts/test.sh", "--collect-only"],
        cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("flag", ["SKIP_VLLM", "SKIP_MLFLOW"])
def test_ci_refuses_to_skip_a_tier(flag):
    result = run_test_sh(CI="true", DATABASE_URL=POSTGRES, **{flag: "1"})
    assert result.returncode == 1
    assert f"CI=true: {flag}=1 is refused" in result.stderr


def test_ci_refuses_sqlite_because_the_fault_tier_needs_postgresql():
    result = run_test_sh(CI="true")
    assert result.returncode == 1
    assert "CI=true: the faults tier cannot run: DATABASE_URL is not PostgreSQL" in result.stderr


def test_ci_run_exports_ci_true():
    """.ci/run is what CI calls: it must switch test.sh to strict."""
    assert "export CI=true" in (REPO / ".ci" / "run").read_text()
