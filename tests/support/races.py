"""Two or more writers at the same moment, each in a thread with its own
database connection (closed when it ends), for the race tests on PostgreSQL.

    racers = Racers(mint=mint, deactivate=deactivate)   # started at once
    ...                                                  # steer them (events, locks)
    assert racers.outcomes() == {"mint": 1, "deactivate": None}

An outcome is what the callable returned, or the exception it raised: a race
test checks both sides' ends, errors included."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


class Racers:
    def __init__(self, **work: Callable[[], object]) -> None:
        self._outcomes: dict[str, object] = {}
        self._threads = [
            threading.Thread(target=self._run, args=(name, each), name=f"racer-{name}")
            for name, each in work.items()
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, name: str, work: Callable[[], object]) -> None:
        try:
            self._outcomes[name] = work()
        except Exception as error:  # the outcome is what the test checks
            self._outcomes[name] = error
        finally:
            connection.close()

    def outcomes(self, timeout: float = 60) -> dict[str, object]:
        """Each racer's outcome once all have ended; a racer still running
        after `timeout` fails the test, naming it."""
        for thread in self._threads:
            thread.join(timeout=timeout)
            assert not thread.is_alive(), f"{thread.name} still runs after {timeout} s"
        return dict(self._outcomes)
