"""Helpers for the in-process Celery workers of the vLLM and browser tiers."""

from __future__ import annotations

import time


def queue_names(app) -> list[str]:
    """Every queue the product routes to (config/settings.py CELERY_TASK_QUEUES):
    a worker started without -Q consumes them all, and a test purges them all."""
    return [queue.name for queue in app.conf.task_queues]


def purge_queues(app) -> None:
    """Messages of an earlier test name rows that no longer exist."""
    with app.connection_for_write() as connection:
        for name in queue_names(app):
            connection.default_channel.queue_purge(name)


def wait_rollouts_succeeded(ids, *, timeout: float) -> None:
    """Wait until every rollout in ids has ended, then require that each succeeded
    (the failures name the adapter and its error)."""
    from serving.models import Rollout, RolloutStatus
    from serving.rules.transitions import ROLLOUT_TERMINAL

    ids = list(ids)
    deadline = time.monotonic() + timeout
    while True:
        statuses = dict(Rollout.objects.filter(pk__in=ids).values_list("pk", "status"))
        waiting = sorted(s for s in statuses.values() if s not in ROLLOUT_TERMINAL)
        if not waiting:
            break
        assert time.monotonic() < deadline, f"not finished after {timeout:.0f} s: {waiting}"
        time.sleep(0.5)
    failed = Rollout.objects.filter(pk__in=ids).exclude(status=RolloutStatus.SUCCEEDED)
    assert not failed.exists(), [(r.adapter.served_name, r.error) for r in failed]
