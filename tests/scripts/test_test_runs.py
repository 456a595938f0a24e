"""scripts/test_runs.sh, the pytest runs of `make test`, driven with a pytest
that only records its arguments: which runs happen with which tiers, that a
failing run fails the whole, and the clock's guard under CI=true."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tier_clock import TIERS

REPO = Path(__file__).resolve().parents[2]

# Stands in for pytest: records its arguments and a tier time as
# tests/support/tier_clock.py would, sleeps, exits as the test says.
FAKE_PYTEST = """#!{python}
import json, os, sys, time
args = sys.argv[1:]
run = "light" if any(arg.startswith("not (") for arg in args) else "heavy"
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
with open(os.environ["FAKE_LOG"] + ".brokers", "a") as log:
    log.write(json.dumps([run, os.environ.get("CELERY_BROKER_URL", ""),
                          os.environ.get("DATABASE_URL", "")]) + "\\n")
with open(os.environ["FAKE_LOG"] + ".nice", "a") as log:
    log.write(json.dumps([run, os.nice(0)]) + "\\n")
with open(os.environ["SUITE_TIER_TIMES"], "a") as times:
    tier = "light" if run == "light" else "vllm"
    times.write(json.dumps({{"tier": tier, "seconds": 90.0, "tests": 3}}) + "\\n")
    if run == "heavy":  # a real vLLM start and a heavy file, as the suite's own write them
        times.write(json.dumps({{"vllm_boot": "shared-0"}}) + "\\n")
        times.write(json.dumps({{"file": "tests/test_slow.py", "seconds": 90}}) + "\\n")
started = time.time()
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
with open(os.environ["FAKE_LOG"] + ".spans", "a") as log:
    log.write(json.dumps([run, started, time.time()]) + "\\n")
sys.exit(int(os.environ.get("FAKE_EXIT_" + run.upper(), "0")))
"""


@pytest.fixture
def run_test_runs(tmp_path):
    fake = tmp_path / "pytest"
    fake.write_text(FAKE_PYTEST.format(python=sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def run(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        base = {k: v for k, v in os.environ.items() if k not in {"CI", "SUITE_RUNS"}}
        # One after the other unless a test asks (CI's PostgreSQL and Redis
        # would otherwise put the two runs side by side, in either order).
        base["SUITE_OVERLAP"] = "0"
        done = subprocess.run(
            ["bash", "scripts/test_runs.sh", *args],
            cwd=REPO,
            env={**base, "PYTEST": str(fake), "PYTHON": sys.executable, "FAKE_LOG": str(log)} | env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return done, calls

    return run


def marker_of(call: list[str]) -> str:
    return call[call.index("-m") + 1]


def test_the_light_tiers_run_on_two_workers_and_the_heavy_ones_on_two_of_their_own(run_test_runs):
    done, calls = run_test_runs()
    assert done.returncode == 0, done.stderr
    light, heavy = calls
    assert light[light.index("-n") + 1] == "2"
    # A file's tests stay on one heavy worker, with its module's servers.
    # ... handed out slowest first, in tests/support/file_order.py's order.
    assert heavy[:5] == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    # compose: a run of its own, after these (scripts/test.sh, scripts/compose/test.sh).
    assert marker_of(light) == f"not ({marker_of(heavy)} or compose)"
    # Every other tier the clock names is in the heavy run, and nothing else is.
    assert set(re.split(r"\s+or\s+", marker_of(heavy))) == set(TIERS) - {"compose"}
    assert "--durations=25" in light and "--durations=25" in heavy


def test_the_arguments_go_to_every_run(run_test_runs):
    done, calls = run_test_runs("--collect-only", "tests/core")
    assert done.returncode == 0, done.stderr
    assert [call[-2:] for call in calls] == [["--collect-only", "tests/core"]] * 2


def test_one_run_alone(run_test_runs):
    done, calls = run_test_runs(SUITE_RUNS="heavy")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 1 and not marker_of(calls[0]).startswith("not")


def test_a_failing_light_run_still_runs_the_heavy_one_and_fails_the_whole(run_test_runs):
    done, calls = run_test_runs(FAKE_EXIT_LIGHT="1")
    assert len(calls) == 2
    assert done.returncode == 1
    assert "make test FAILED: the light run (pytest exit 1)" in done.stderr


def test_no_tests_collected_fails_a_run_unless_arguments_chose_the_tests(run_test_runs):
    done, _ = run_test_runs(FAKE_EXIT_HEAVY="5")
    assert done.returncode == 1
    assert "the heavy run (pytest exit 5)" in done.stderr
    done, _ = run_test_runs("tests/core", FAKE_EXIT_HEAVY="5")
    assert done.returncode == 0, done.stderr


def test_the_clock_prints_each_run_and_tier(run_test_runs):
    done, _ = run_test_runs()
    assert re.search(r"run light\s+0\.0 min\s+\(exit 0\)", done.stdout), done.stdout
    assert re.search(r"run heavy\s+0\.0 min\s+\(exit 0\)", done.stdout), done.stdout
    assert re.search(r"vllm\s+1\.5 min\s+\(3 tests\)", done.stdout), done.stdout
    assert "pytest total" in done.stdout
    assert "real vLLM servers started: 1" in done.stdout


def test_a_run_can_refresh_the_heavy_file_order(run_test_runs, tmp_path):
    weights = tmp_path / "heavy_file_seconds.json"

    done, _ = run_test_runs(SUITE_FILE_SECONDS=str(weights))

    assert done.returncode == 0, done.stderr
    assert json.loads(weights.read_text()) == {"tests/test_slow.py": 90}


def test_under_ci_a_suite_past_the_guard_fails_naming_the_slowest_tiers(run_test_runs):
    # 0.02 minutes is 1.2 s: two runs of 1 s each pass it.
    slow = {"FAKE_SLEEP": "1", "SUITE_LIMIT_MINUTES": "0.02"}
    done, _ = run_test_runs(CI="true", **slow)
    assert done.returncode == 1
    assert "past the 0.02-minute guard: the run FAILS; the slowest tiers: light (1.5 min)" in (
        done.stdout
    )
    assert "make test FAILED: the pytest-time guard" in done.stderr

    done, _ = run_test_runs(**slow)
    assert done.returncode == 0, done.stderr
    assert "the run would fail under CI=true" in done.stdout


SERVERS = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
}


def lines_of(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def servers_of(tmp_path) -> dict[str, list[str]]:
    """{run: [its broker, its database]}"""
    return {run: servers for run, *servers in lines_of(tmp_path / "calls.jsonl.brokers")}


def test_on_postgresql_and_redis_the_runs_go_side_by_side_each_on_its_own_servers(
    run_test_runs, tmp_path
):
    # Each run sleeps 2 s; side by side, each starts before the other ends.
    # (Their spans, not the guard's wall clock: a loaded machine can take
    # seconds to start a Python, and failed a 6-second guard in CI.)
    done, calls = run_test_runs(SUITE_OVERLAP="auto", FAKE_SLEEP="2", CI="true", **SERVERS)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    spans = {run: (start, end) for run, start, end in lines_of(tmp_path / "calls.jsonl.spans")}
    assert spans["light"][0] < spans["heavy"][1] and spans["heavy"][0] < spans["light"][1], spans
    # Redis databases 2-3 for the light run's workers, 4-5 for the heavy one's;
    # the heavy workers' test databases are test_test_heavy_gw0 and _gw1.
    assert servers_of(tmp_path) == {
        "light": ["redis://127.0.0.1:6379/2", "postgres://postgres@127.0.0.1:5432/test"],
        "heavy": ["redis://127.0.0.1:6379/4", "postgres://postgres@127.0.0.1:5432/test_heavy"],
    }
    (heavy,) = [call for call in calls if not marker_of(call).startswith("not")]
    # ... handed out slowest first, in tests/support/file_order.py's order.
    assert heavy[:5] == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert "(the runs side by side; guard: 70 min" in done.stdout, done.stdout
    # The light run's output is shown too, after the heavy run's.
    assert done.stdout.index("=== the heavy run") < done.stdout.index("=== the light run: nice")
    # The light run takes only the CPU the heavy run leaves.
    nice = dict(lines_of(tmp_path / "calls.jsonl.nice"))
    assert nice["light"] == min(19, nice["heavy"] + 10), nice  # 19: nice's floor


def test_by_default_ci_s_servers_put_the_runs_side_by_side(run_test_runs):
    done, calls = run_test_runs(SUITE_OVERLAP="", CI="true", **SERVERS)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    assert "side by side" in done.stdout, done.stdout


def test_side_by_side_a_failing_light_run_fails_the_whole(run_test_runs):
    done, calls = run_test_runs(SUITE_OVERLAP="auto", FAKE_EXIT_LIGHT="1", **SERVERS)
    assert len(calls) == 2
    assert done.returncode == 1
    assert "make test FAILED: the light run (exit 1)" in done.stderr


def test_on_the_embedded_defaults_the_runs_go_one_after_the_other(run_test_runs, tmp_path):
    embedded = {"DATABASE_URL": "", "CELERY_BROKER_URL": ""}
    done, calls = run_test_runs(SUITE_OVERLAP="auto", FAKE_SLEEP="1", **embedded)
    assert done.returncode == 0, done.stderr
    light, heavy = calls  # one after the other, light first
    assert marker_of(light).startswith("not (") and not marker_of(heavy).startswith("not")
    assert "side by side" not in done.stdout
