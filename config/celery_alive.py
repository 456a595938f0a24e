"""The workers' liveness check (config/celery_liveness.py says what it proves).

    python -m config.celery_alive /tmp/worker-alive --max-age 60

Exit 0 if the worker consumed its own liveness ping within --max-age seconds,
1 if not (or never). It reads one file's modification time: no Django set-up,
no broker connection, so a probe every few seconds costs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from config.celery_liveness import PATH_ENV

DEFAULT_MAX_AGE_SECONDS = 60.0


def age_seconds(path: Path, now: float | None = None) -> float | None:
    """Seconds since the worker last consumed its ping; None if it never has."""
    try:
        modified = path.stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - modified)


def is_fresh(path: Path, max_age: float, since: float | None = None) -> bool:
    """Touched within `max_age` seconds (and, with `since`, after that wall time)."""
    try:
        modified = path.stat().st_mtime
    except OSError:
        return False
    if since is not None and modified < since:
        return False
    return time.time() - modified <= max_age


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m config.celery_alive",
        description="Exit 0 if the worker consumed its liveness ping within --max-age seconds.",
    )
    parser.add_argument("path", type=Path, nargs="?", default=os.environ.get(PATH_ENV))
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_SECONDS)
    args = parser.parse_args(argv)
    if args.path is None:
        parser.error(f"give the file, or set {PATH_ENV}")
    age = age_seconds(args.path)
    if age is None:
        print(f"not alive: {args.path} does not exist (the worker never consumed a ping)")
        return 1
    if age > args.max_age:
        print(f"not alive: last ping consumed {age:.0f} s ago (limit {args.max_age:.0f} s)")
        return 1
    print(f"alive: last ping consumed {age:.1f} s ago")
    return 0


if __name__ == "__main__":
    sys.exit(main())
