"""`make run`'s supervisor: runs named commands, restarts one that exits (and
says so), keeps the others running; SIGINT (Ctrl-C) or SIGTERM stops them all.

    python scripts/supervise.py --log-dir var/log \\
        --program web 'python manage.py runserver 127.0.0.1:8000' \\
        --program worker-rollouts 'celery -A config worker -Q rollouts ...'

Each program's output goes to <log-dir>/<name>.log; the supervisor's own lines
(started, exited with status N, restarting in S s) go to stdout and to
<log-dir>/supervisor.log. A program that keeps dying is restarted after a
growing delay (core.backoff, up to 30 s); one that ran for a minute starts
again from 1 s.

A program named with --liveness (the Celery workers) must also prove that it
still consumes: it gets WORKER_LIVENESS_FILE=<log-dir>/liveness/<name>, which
the worker touches each time it consumes its own ping through the broker
(config/celery_liveness.py). A worker alive but deaf (after a broker restart,
frozen, stuck in a shutdown) stops touching it; once the file is older than
--liveness-max-age (or never appears within --liveness-grace of a start) the
supervisor SIGKILLs the worker's group and restarts it like one that exited.
Its tasks in hand are given up: acked late, they are redelivered or, for
rollouts, resumed by the sweeper.

Each program runs in its own process group, so Ctrl-C reaches only the
supervisor, which stops the programs in order (SIGTERM, then SIGKILL after
--grace seconds; a Celery worker stops within seconds, see
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT). The standard library is enough here;
supervisord would add a daemon, a config file and a control socket to
`make run` for the same four behaviours.

No program outlives the supervisor, however it ends (a second Ctrl-C, a closed
terminal, SIGKILL): a watchdog process, in a session of its own, holds the read
end of a pipe and learns each program's group from it. When the pipe closes
without the supervisor's "all stopped", the supervisor is gone: the watchdog
stops every group it knows (SIGTERM, SIGKILL after the grace) and exits.
PR_SET_PDEATHSIG would reach only the direct children, not a worker's pool or
vLLM's engine process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from config.celery_alive import age_seconds  # noqa: E402
from config.celery_liveness import PATH_ENV  # noqa: E402
from core.backoff import backoff_delay  # noqa: E402

STABLE_AFTER_SECONDS = 60.0


@dataclass
class Program:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None
    handles: list = field(default_factory=list)
    # The file the worker touches each time it consumes its liveness ping.
    liveness: Path | None = None
    started_wall: float = 0.0

    def start(self) -> None:
        handle = self.log.open("ab")
        self.handles.append(handle)
        env = None
        if self.liveness is not None:
            self.liveness.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, PATH_ENV: str(self.liveness)}
        self.process = subprocess.Popen(
            self.command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.restart_at = None

    def deaf_for(self, max_age: float, grace: float) -> float | None:
        """Seconds without a consumed ping, once that is past the limits; else None."""
        if self.liveness is None:
            return None
        age = age_seconds(self.liveness)
        ran = time.monotonic() - self.started_at
        if age is None or time.time() - age < self.started_wall:
            # Not a ping of this process yet: it may still be starting.
            return ran if ran > grace else None
        return age if age > max_age else None


class Watchdog:
    """The supervisor's side of the watchdog (see the module's docstring)."""

    ALL_STOPPED = "stopped"

    def __init__(self, grace: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--watchdog", str(grace)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )

    def _tell(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.process.stdin.write(f"{line}\n".encode())
            self.process.stdin.flush()

    def watch(self, pgid: int) -> None:
        self._tell(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        # A group that ended may be reused by an unrelated process later.
        self._tell(f"-{pgid}")

    def release(self) -> None:
        self._tell(self.ALL_STOPPED)
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def watchdog_main(grace: float) -> int:
    """The watchdog process: reads +pgid / -pgid lines until the pipe closes."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line == Watchdog.ALL_STOPPED:
            return 0
        if line[:1] == "+":
            groups.add(int(line[1:]))
        elif line[:1] == "-":
            groups.discard(int(line[1:]))
    # The pipe closed without "stopped": the supervisor died. Stop what it ran.
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
        groups = {pgid for pgid in groups if _group_exists(pgid)}
        time.sleep(0.1)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return 0


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Supervisor:
    def __init__(
        self,
        programs: list[Program],
        log: Path,
        grace: float,
        liveness_max_age: float = 60.0,
        liveness_grace: float = 120.0,
    ):
        self.programs, self.grace = programs, grace
        self.liveness_max_age, self.liveness_grace = liveness_max_age, liveness_grace
        self.log = log.open("a", buffering=1)
        self.stopping = False
        self.watchdog: Watchdog | None = None

    def _start(self, program: Program) -> None:
        program.start()
        if self.watchdog is not None:
            self.watchdog.watch(program.process.pid)

    def say(self, message: str) -> None:
        line = f"{datetime.now(UTC).isoformat(timespec='seconds')} supervise: {message}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def run(self) -> int:
        self.watchdog = Watchdog(self.grace)
        for program in self.programs:
            self._start(program)
            self.say(f"started {program.name} (pid {program.process.pid})")
        while not self.stopping:
            now = time.monotonic()
            for program in self.programs:
                if program.restart_at is not None:
                    if now >= program.restart_at:
                        program.restarts += 1
                        self._start(program)
                        self.say(
                            f"restarted {program.name} (pid {program.process.pid}, "
                            f"restart {program.restarts})"
                        )
                    continue
                code = program.process.poll()
                if code is None:
                    deaf = program.deaf_for(self.liveness_max_age, self.liveness_grace)
                    if deaf is None:
                        continue
                    # Alive but not consuming: SIGTERM would wait for tasks that can
                    # never be acked (or reach a frozen process not at all).
                    self.say(
                        f"{program.name} consumed no liveness ping for {deaf:.0f} s "
                        f"({program.liveness}): killing it"
                    )
                    _signal_group(program.process, signal.SIGKILL)
                    code = program.process.wait()
                if self.watchdog is not None:
                    self.watchdog.forget(program.process.pid)
                ran = now - program.started_at
                program.failures_in_a_row = (
                    0 if ran >= STABLE_AFTER_SECONDS else program.failures_in_a_row + 1
                )
                delay = backoff_delay(program.failures_in_a_row, base=0.5, cap=30)
                program.restart_at = now + delay
                self.say(
                    f"{program.name} exited with {_describe(code)} after {ran:.1f} s; "
                    f"restarting in {delay:.1f} s (see {program.log})"
                )
            time.sleep(0.2)
        return self.stop_all()

    def request_stop(self, signum, _frame) -> None:
        if not self.stopping:
            self.stopping = True
            self.say(f"{signal.Signals(signum).name}: stopping every program")

    def stop_all(self) -> int:
        running = [p for p in self.programs if p.process and p.process.poll() is None]
        for program in reversed(running):
            _signal_group(program.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for program in running:
            try:
                program.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{program.name} did not stop within {self.grace:.0f} s: SIGKILL")
                _signal_group(program.process, signal.SIGKILL)
                program.process.wait()
        for program in self.programs:
            for handle in program.handles:
                handle.close()
        if self.watchdog is not None:
            self.watchdog.release()
        self.say("every program stopped")
        return 0


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--watchdog"]:
        return watchdog_main(float(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--grace", type=float, default=30.0, help="seconds before SIGKILL")
    parser.add_argument(
        "--program", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True
    )
    parser.add_argument(
        "--liveness",
        action="append",
        default=[],
        metavar="NAME",
        help="a Celery worker program that must keep consuming its liveness ping",
    )
    parser.add_argument(
        "--liveness-max-age",
        type=float,
        default=60.0,
        help="seconds without a consumed ping before the worker is killed and restarted",
    )
    parser.add_argument(
        "--liveness-grace",
        type=float,
        default=120.0,
        help="seconds a started worker has to consume its first ping",
    )
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    names = {name for name, _ in args.program}
    if unknown := set(args.liveness) - names:
        parser.error(f"--liveness names no --program: {', '.join(sorted(unknown))}")
    programs = [
        Program(
            name,
            shlex.split(command),
            args.log_dir / f"{name}.log",
            liveness=(args.log_dir / "liveness" / name) if name in args.liveness else None,
        )
        for name, command in args.program
    ]
    supervisor = Supervisor(
        programs,
        args.log_dir / "supervisor.log",
        args.grace,
        liveness_max_age=args.liveness_max_age,
        liveness_grace=args.liveness_grace,
    )
    signal.signal(signal.SIGINT, supervisor.request_stop)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
