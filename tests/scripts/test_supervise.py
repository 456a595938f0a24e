"""`make run`'s supervision (scripts/supervise.py, used by scripts/run.sh): a
program that dies is restarted and logged, the others keep running, and
SIGINT (Ctrl-C) stops every one of them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# In the fault tier's run: its programs die, restart and stop within seconds,
# which the light run, niced beside the heavy one, cannot promise
# (scripts/test_runs.sh).
pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]
SLEEPER = f"{sys.executable} -c 'import time; time.sleep(600)'"


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _pids(log: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    text = log.read_text() if log.exists() else ""
    for name, pid in re.findall(r"(?:started|restarted) (\S+) \(pid (\d+)", text):
        found.setdefault(name, []).append(int(pid))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (its parent, the supervisor, has not reaped it yet).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.fixture
def supervisor(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "supervise.py"), "--log-dir", str(tmp_path),
         "--grace", "5", "--program", "worker", SLEEPER, "--program", "web", SLEEPER],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield process, tmp_path / "supervisor.log"
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_program_that_dies_is_restarted_and_the_others_keep_running(supervisor):
    process, log = supervisor
    first = _wait_for(lambda: len(_pids(log)) == 2 and _pids(log), 10, "both programs")
    worker, web = first["worker"][0], first["web"][0]

    os.kill(worker, signal.SIGKILL)

    again = _wait_for(lambda: len(_pids(log).get("worker", [])) == 2 and _pids(log), 10, "restart")
    assert again["worker"][1] != worker and _alive(again["worker"][1])
    assert _alive(web) and again["web"] == [web]
    assert "worker exited with signal SIGKILL" in log.read_text()
    assert process.poll() is None


def test_sigint_stops_every_program(supervisor):
    process, log = supervisor
    pids = _wait_for(lambda: len(_pids(log)) == 2 and _pids(log), 10, "both programs")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=15) == 0
    for name, [pid] in pids.items():
        assert not _alive(pid), f"{name} still runs"
    assert "every program stopped" in log.read_text()


# A program with a child of its own in its group (as a Celery worker has its pool
# and vLLM its engine process): the shell forks a sleeper, then waits.
WITH_A_CHILD = "sh -c 'sleep 600 & wait'"


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP])
def test_no_program_outlives_the_supervisor_however_it_ends(tmp_path, how):
    """A second Ctrl-C, a closed terminal or SIGKILL: the programs and their own
    children stop too (the supervisor's watchdog)."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "supervise.py"), "--log-dir", str(tmp_path),
         "--grace", "3", "--program", "worker", WITH_A_CHILD, "--program", "web", SLEEPER],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log = tmp_path / "supervisor.log"
    try:
        pids = _wait_for(lambda: len(_pids(log)) == 2 and _pids(log), 10, "both programs")
        groups = [found[0] for found in pids.values()]
        members = _wait_for(
            lambda: len(_group_members(groups[0])) == 2 and _group_members(groups[0]),
            10, "the worker's own child",
        )  # fmt: skip
        everyone = [*members, pids["web"][0]]
        process.send_signal(how)
        process.wait(timeout=30)  # generous: a loaded CI machine
        _wait_for(lambda: not any(_alive(pid) for pid in everyone), 10, "every program to stop")
    finally:
        if process.poll() is None:
            process.kill()
    assert not any(_group_members(group) for group in groups)


# Touches its liveness file (as a worker does each time it consumes its ping)
# for about a second, then stays alive without touching it: a deaf worker.
GOES_DEAF = (
    f"{sys.executable} -c 'import os, pathlib, time\n"
    'path = pathlib.Path(os.environ["WORKER_LIVENESS_FILE"])\n'
    "for _ in range(5):\n    path.touch(); time.sleep(0.2)\n"
    "time.sleep(600)'"
)


def test_a_worker_alive_but_deaf_is_killed_and_restarted_and_a_live_one_is_left(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "supervise.py"), "--log-dir", str(tmp_path),
         "--grace", "5", "--liveness-max-age", "2", "--liveness-grace", "30",
         "--program", "deaf", GOES_DEAF, "--program", "web", SLEEPER, "--liveness", "deaf"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log = tmp_path / "supervisor.log"
    try:
        first = _wait_for(lambda: len(_pids(log)) == 2 and _pids(log), 10, "both programs")
        deaf, web = first["deaf"][0], first["web"][0]
        again = _wait_for(lambda: len(_pids(log).get("deaf", [])) == 2 and _pids(log), 20, "kill")
        assert not _alive(deaf) and _alive(again["deaf"][1])
        text = log.read_text()
        assert re.search(r"deaf consumed no liveness ping for \d+ s .*: killing it", text), text
        assert "deaf exited with signal SIGKILL" in text
        # Without --liveness a silent program is left alone.
        assert _alive(web) and again["web"] == [web]
        assert (tmp_path / "liveness" / "deaf").exists()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)


def test_liveness_must_name_a_program(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "supervise.py"), "--log-dir", str(tmp_path),
         "--program", "web", SLEEPER, "--liveness", "worker"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--liveness names no --program: worker" in result.stderr


def test_the_liveness_check_says_fresh_stale_or_never(tmp_path):
    path = tmp_path / "alive"

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "config.celery_alive", str(path), *args],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    never = check()
    assert never.returncode == 1 and "does not exist" in never.stdout
    path.touch()
    assert check("--max-age", "60").returncode == 0
    old = time.time() - 120
    os.utime(path, (old, old))
    stale = check("--max-age", "60")
    assert stale.returncode == 1 and re.search(r"consumed 12\d s ago", stale.stdout), stale.stdout
    assert "RuntimeWarning" not in stale.stderr


def test_a_real_worker_on_the_embedded_broker_proves_it_consumes_and_is_restarted_when_frozen(
    tmp_path,
):
    """The ping crosses the embedded broker (SQLite) too; a frozen worker is replaced."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DATABASE_URL"))}
    env.update(
        DJANGO_SECRET_KEY="test-only", VAR_DIR=str(tmp_path / "var"),
        WORKER_LIVENESS_INTERVAL_SECONDS="0.5",
    )  # fmt: skip
    worker = f"{sys.executable} -m celery -A config worker -Q housekeeping -n live@%h -c 1"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "supervise.py"), "--log-dir", str(tmp_path),
         "--grace", "5", "--liveness-max-age", "4", "--liveness-grace", "90",
         "--program", "worker", worker, "--liveness", "worker"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log, alive = tmp_path / "supervisor.log", tmp_path / "liveness" / "worker"
    try:
        _wait_for(lambda: alive.exists() and time.time() - alive.stat().st_mtime < 2, 90, "a ping")
        frozen = _pids(log)["worker"][0]
        os.kill(frozen, signal.SIGSTOP)
        again = _wait_for(lambda: len(_pids(log).get("worker", [])) == 2 and _pids(log), 30, "kill")
        assert not _alive(frozen)
        started = time.time()
        _wait_for(lambda: alive.stat().st_mtime > started, 90, "a ping from the new worker")
        assert _alive(again["worker"][1])
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
