"""Waiting for a helper process the tests started (a web server, moto, MLflow,
HAProxy, Prometheus, the OpenID provider) to come up, bounded by the CPU time
it used rather than by the wall clock.

`make test` runs the light tests niced beside the heavy run, and a niced
process can wait minutes for the second of CPU its start needs while vLLM
holds both cores (CI: node not started in 120 s, on 2026-12-06). A process
that spins still fails, on its own CPU time; one blocked outright fails on a
wall clock far past any start seen.

    wait_until_started(proc, lambda: port_answers(...), what="moto", log=log_path)
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil


class NotStarted(RuntimeError):
    """The process exited, or used its CPU or wall-clock bound, before it was ready."""


def cpu_seconds_of(pid: int) -> float:
    """User and system CPU of the process and its children, living or reaped."""
    with contextlib.suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        total = 0.0
        for each in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = each.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        return total
    return 0.0


def _tail(log: Path | None, chars: int = 3000) -> str:
    if log is None:
        return ""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_until_started(
    process: subprocess.Popen,
    ready: Callable[[], bool],
    *,
    what: str,
    log: Path | None = None,
    cpu_seconds: float = 30,
    wall_seconds: float = 600,
    poll_seconds: float = 0.05,
) -> float:
    """Returns the seconds it took once `ready()` is true. Raises NotStarted
    (naming the seconds, its CPU time and its log's tail) if the process exits
    first, or uses `cpu_seconds` of CPU, or `wall_seconds` pass."""
    started = time.monotonic()
    used = 0.0
    while True:
        if ready():
            return time.monotonic() - started
        if process.poll() is not None:
            raise NotStarted(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        used = cpu_seconds_of(process.pid)
        waited = time.monotonic() - started
        if used >= cpu_seconds or waited >= wall_seconds:
            raise NotStarted(
                f"{what} did not start in {waited:.0f} s ({used:.2f} s of its own CPU):\n"
                f"{_tail(log)}"
            )
        time.sleep(poll_seconds)
