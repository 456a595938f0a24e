"""A worker's SIGTERM ends the process within a bound, whatever Celery's shutdown does.

With REMAP_SIGTERM=SIGQUIT (the Dockerfile and scripts/run.sh), SIGTERM is Celery's
cold shutdown: wait CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT, cancel the tasks in hand,
join the pool. Celery 5.7 runs all of it inside the signal handler, and the join
can wait forever:

- when the signal lands while the event loop is between reading a task's result
  from the pool and handing it on, that result is lost with the interrupted frame,
  and the pool's flush waits for it (the compose tier's stop test took podman's
  whole timeout; a worker alone, fed short tasks on a loaded machine, hung in 3 of
  30 stops, every stack in ``AsynPool._flush_outqueue``);
- a pool process that no longer runs (frozen, or stopped by a debugger) is never
  joined.

Both hangs end when the pool's processes are gone: the pool's join then sees
every worker exited and returns, and Celery finishes its shutdown as usual (the
task in hand is rejected back to the broker, and so delivered again at once). So
the first SIGTERM also starts a watchdog thread: if the process still runs after
the soft wait and POOL_GRACE_SECONDS, it kills the pool's processes; if it still
runs EXIT_GRACE_SECONDS later, it exits. Tasks are acked late and idempotent,
and rollouts hold claims the sweeper takes back, so even that exit loses nothing:
a message left unacked comes back after the broker's visibility timeout. The
watchdog writes to stderr directly: the stuck main thread may hold the logging
lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

# A cold shutdown that works takes 1-4 s after the soft wait here, on a loaded
# machine (killing the pool of one that is merely slow cancels what the shutdown
# was cancelling anyway); both graces together keep a stop inside Docker's default
# 10 s stop timeout.
POOL_GRACE_SECONDS = 4.0
EXIT_GRACE_SECONDS = 4.0
EXIT_CODE = 1  # Celery's own for a cold shutdown (EX_FAILURE)


def install(app) -> None:
    """Wraps the worker's SIGTERM handler once Celery has installed its own."""
    from celery import signals

    @signals.worker_ready.connect(weak=False)
    def _bound_the_shutdown(sender=None, **_kwargs) -> None:
        soft_wait = float(app.conf.worker_soft_shutdown_timeout or 0)
        guard(signal.SIGTERM, soft_wait + POOL_GRACE_SECONDS)


def guard(signum: int, pool_deadline_seconds: float) -> None:
    """Runs the current handler of ``signum`` after starting the watchdog (once)."""
    previous = signal.getsignal(signum)
    if getattr(previous, "shutdown_bound", False) or not callable(previous):
        return  # already guarded (a consumer restart sends worker_ready again)
    started = threading.Event()

    def bounded(sig: int, frame: Any) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(
                target=_watch, args=(pool_deadline_seconds,), name="shutdown-bound", daemon=True
            ).start()
        assert callable(previous)
        previous(sig, frame)

    bounded.shutdown_bound = True  # type: ignore[attr-defined]
    signal.signal(signum, bounded)


def _watch(pool_deadline_seconds: float) -> None:
    time.sleep(pool_deadline_seconds)
    _say(
        f"worker: shutdown not finished {pool_deadline_seconds:.0f} s after SIGTERM: "
        "killing the pool's processes (the tasks in hand are delivered again)"
    )
    _kill_pool()
    time.sleep(EXIT_GRACE_SECONDS)
    _say(f"worker: shutdown still not finished {EXIT_GRACE_SECONDS:.0f} s later: exiting")
    os._exit(EXIT_CODE)


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _kill_pool() -> None:
    # The pool's processes are this process's children (billiard's prefork pool).
    # SIGKILL reaches a frozen one too.
    from billiard.process import active_children

    for child in active_children():
        if child.pid:
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
