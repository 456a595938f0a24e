"""A task that holds a worker for as long as it is told: the worker-shutdown tests
need a task in hand when SIGTERM arrives. Imported only by those tests' workers
(`celery worker -I tests.support.slow_task`)."""

import time
from pathlib import Path

from celery import shared_task


@shared_task(name="tests.hold_worker", acks_late=True)
def hold_worker(seconds: float, started_file: str) -> None:
    Path(started_file).write_text(str(time.time()))
    time.sleep(seconds)
