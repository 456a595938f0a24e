"""A worker stops within seconds of SIGTERM, even with a long task in hand, and the
task is not lost: acked late, it is delivered again to the next worker (a rollout
would also be resumed by the sweeper once its claim expires)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.processes import REPO_ROOT, RedisServer, _Group

# In the fault tier's run: it times a process of its own, which the light run,
# niced beside the heavy one, cannot promise (scripts/test_runs.sh).
pytestmark = pytest.mark.faults

# docs/operators/workers.md promises "within a few seconds": the soft wait (1 s)
# and Celery's cold shutdown. Alone here it takes 2.5-3.4 s; in the suite, on two
# cores at about 90%, 5.3 s was seen. The task in hand holds 120 s: a worker
# that waited for it would be far past this bound whatever the load.
STOP_LIMIT_SECONDS = 8.0
# A shutdown that hangs is freed by config/celery_shutdown.py, which kills the pool
# after the soft wait and its grace (1 + 4 s) and exits 4 s later at the latest;
# the rest is margin for a loaded machine, still well inside the 30 s that podman
# and Kubernetes give before SIGKILL.
HUNG_STOP_LIMIT_SECONDS = 20.0


class _Worker(_Group):
    def start(self, env: dict[str, str]) -> _Worker:
        command = [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            "-I", "tests.support.slow_task", "-Q", "celery", "-n", "shutdown@%h",
            "--pool", "prefork", "--concurrency", "1", "--loglevel=INFO",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        self._spawn(command, env, REPO_ROOT)
        return self


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(params=["embedded", "redis"])
def broker_url(request, tmp_path):
    """The embedded broker of `make run`, and Redis as in production (a server of the
    test's own: nothing else consumes or publishes there)."""
    if request.param == "embedded":
        yield f"sqlite:///{tmp_path / 'broker.sqlite3'}"
        return
    redis = RedisServer(tmp_path / "redis").start()
    try:
        yield redis.url()
    finally:
        redis.kill()


@pytest.fixture
def worker_env(tmp_path, broker_url) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_DEBUG": "true",
        "DJANGO_SECRET_KEY": "worker-shutdown-test",
        "VAR_DIR": str(tmp_path / "var"),
        "CELERY_BROKER_URL": broker_url,
        "REMAP_SIGTERM": "SIGQUIT",  # as the Dockerfile and scripts/run.sh set it
    }
    env.pop("DATABASE_URL", None)
    return env


def _send_hold(env: dict[str, str], seconds: float, started: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "config", "call", "tests.hold_worker",
         "--args", f"[{seconds}, \"{started}\"]"],
        env=env, cwd=REPO_ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def _assert_delivered_again(tmp_path: Path, env: dict[str, str], started: Path) -> None:
    """The task in hand was cancelled, not acked: the next worker gets it again."""
    started.unlink()
    second = _Worker(tmp_path / "worker-2.log").start(env)
    try:
        _wait_for(started.exists, 90, f"the task to be delivered again:\n{second.log_tail()}")
    finally:
        second.kill()


def test_sigterm_stops_a_busy_worker_within_five_seconds_and_the_task_is_delivered_again(
    tmp_path, worker_env
):
    started = tmp_path / "started"
    worker = _Worker(tmp_path / "worker.log").start(worker_env)
    try:
        _send_hold(worker_env, 120, started)
        _wait_for(started.exists, 90, f"the task to start:\n{worker.log_tail()}")

        signalled = time.monotonic()
        worker._signal(signal.SIGTERM)  # what Kubernetes and the supervisor send
        stopped = worker._wait_gone(10)
        assert stopped, f"the worker still runs 10 s after SIGTERM:\n{worker.log_tail()}"
        took = time.monotonic() - signalled
        assert took < STOP_LIMIT_SECONDS, (
            f"the worker took {took:.1f} s to stop (limit {STOP_LIMIT_SECONDS:.0f} s)"
        )
    finally:
        worker.kill()

    _assert_delivered_again(tmp_path, worker_env, started)


def test_sigterm_stops_a_worker_whose_shutdown_hangs_and_the_task_is_delivered_again(
    tmp_path, worker_env
):
    # Celery's cold shutdown runs inside the SIGTERM handler and joins the pool.
    # Celery 5.7 can wait there forever: when the signal lands while the event loop
    # is between reading a task's result from the pool and handing it on, that
    # result is lost and the pool waits for it (found by the compose tier, one stop
    # in about ten under load). A pool process that stops answering makes the same
    # wait, every time: this test freezes it (SIGSTOP), then sends SIGTERM to the
    # main process alone, as podman and Kubernetes do.
    started = tmp_path / "started"
    worker = _Worker(tmp_path / "worker.log").start(worker_env)
    try:
        _send_hold(worker_env, 120, started)
        _wait_for(started.exists, 90, f"the task to start:\n{worker.log_tail()}")
        pool = psutil.Process(worker.pid).children()
        assert len(pool) == 1, pool
        pool[0].suspend()

        signalled = time.monotonic()
        os.kill(worker.pid, signal.SIGTERM)
        stopped = worker._wait_gone(30)
        took = time.monotonic() - signalled
        assert stopped, f"the worker still runs 30 s after SIGTERM:\n{worker.log_tail()}"
        assert took < HUNG_STOP_LIMIT_SECONDS, (
            f"the worker took {took:.1f} s to stop (limit {HUNG_STOP_LIMIT_SECONDS:.0f} s)"
        )
        assert "killing the pool's processes" in worker.log_tail()
    finally:
        worker.kill()

    _assert_delivered_again(tmp_path, worker_env, started)
