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

Each program runs in its own process group, so Ctrl-C reaches only the
supervisor, which stops the programs in order (SIGTERM, then SIGKILL after
--grace seconds: a Celery worker finishes its task first). The standard library
is enough here; supervisord would add a daemon, a config file and a control
socket to `make run` for the same four behaviours.
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

    def start(self) -> None:
        handle = self.log.open("ab")
        self.handles.append(handle)
        self.process = subprocess.Popen(
            self.command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started_at = time.monotonic()
        self.restart_at = None


class Supervisor:
    def __init__(self, programs: list[Program], log: Path, grace: float):
        self.programs, self.grace = programs, grace
        self.log = log.open("a", buffering=1)
        self.stopping = False

    def say(self, message: str) -> None:
        line = f"{datetime.now(UTC).isoformat(timespec='seconds')} supervise: {message}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def run(self) -> int:
        for program in self.programs:
            program.start()
            self.say(f"started {program.name} (pid {program.process.pid})")
        while not self.stopping:
            now = time.monotonic()
            for program in self.programs:
                if program.restart_at is not None:
                    if now >= program.restart_at:
                        program.restarts += 1
                        program.start()
                        self.say(
                            f"restarted {program.name} (pid {program.process.pid}, "
                            f"restart {program.restarts})"
                        )
                    continue
                code = program.process.poll()
                if code is None:
                    continue
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--grace", type=float, default=30.0, help="seconds before SIGKILL")
    parser.add_argument(
        "--program", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True
    )
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    programs = [
        Program(name, shlex.split(command), args.log_dir / f"{name}.log")
        for name, command in args.program
    ]
    supervisor = Supervisor(programs, args.log_dir / "supervisor.log", args.grace)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
