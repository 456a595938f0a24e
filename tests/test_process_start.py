"""tests/support/process_start.py: a helper process's start is bounded by its
own CPU time, so a starved one is waited for and a spinning one is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.process_start import NotStarted, cpu_seconds_of, wait_until_started


def python(code: str) -> subprocess.Popen:
    # Its own process group, so the teardown reaches a child it started too.
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


@pytest.fixture
def started():
    processes: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        processes.append(python(code))
        return processes[-1]

    yield start
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_process_idle_past_any_wall_clock_of_old_is_waited_for(started):
    # Sleeping uses no CPU: a starved process looks the same to the bound.
    process = started("import time; time.sleep(60)")
    ready_at = time.monotonic() + 1.5
    took = wait_until_started(process, lambda: time.monotonic() > ready_at, what="sleeper")
    assert took >= 1.5
    assert cpu_seconds_of(process.pid) < 1


def test_a_spinning_process_fails_on_its_own_cpu_time(started):
    process = started("while True: pass")
    with pytest.raises(NotStarted, match=r"spinner did not start in \d+ s \(0\.[3-9]\d s"):
        wait_until_started(process, lambda: False, what="spinner", cpu_seconds=0.3)


def test_a_process_blocked_outright_fails_on_the_wall_clock(started):
    process = started("import time; time.sleep(60)")
    with pytest.raises(NotStarted, match=r"sleeper did not start in 1 s"):
        wait_until_started(process, lambda: False, what="sleeper", wall_seconds=1)


def test_a_process_that_exits_fails_at_once_with_its_code(started, tmp_path):
    log = tmp_path / "log"
    log.write_text("the reason it gave")
    process = started("raise SystemExit(3)")
    with pytest.raises(NotStarted, match=r"(?s)quitter exited with 3:\nthe reason it gave"):
        wait_until_started(process, lambda: False, what="quitter", log=log, wall_seconds=30)


def test_a_child_s_cpu_counts(started):
    # MLflow and gunicorn do their work in children.
    process = started(
        "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    )
    with pytest.raises(NotStarted, match=r"parent did not start"):
        wait_until_started(process, lambda: False, what="parent", cpu_seconds=0.5, wall_seconds=30)
