"""A Celery app for the broker stress test: the product's own app and broker
settings, plus one task that records each delivery as a file.

`celery -A tests.support.broker_stress worker` runs it; producers import it to
send. STRESS_OUT names the folder the task writes into.
"""

from __future__ import annotations

import os
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from config.celery import app  # noqa: E402

__all__ = ("app", "touch", "produce")


@app.task(name="tests.stress.touch", acks_late=True, ignore_result=True)
def touch(key: str) -> None:
    # O_EXCL: a second delivery of the same message would be counted, not hidden.
    target = Path(os.environ["STRESS_OUT"]) / key
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        (target.parent / f"{key}.again").touch()
        return
    os.close(fd)


def produce(tag: str, threads: int, per_thread: int) -> None:
    """Sends threads × per_thread tasks from this process, all threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    def send(thread: int) -> None:
        for number in range(per_thread):
            touch.delay(f"{tag}-{thread}-{number}")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(send, range(threads)))


if __name__ == "__main__":
    import sys

    produce(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
