"""Helpers for the in-process Celery workers of the vLLM and browser tiers."""

from __future__ import annotations


def queue_names(app) -> list[str]:
    """Every queue the product routes to (config/settings.py CELERY_TASK_QUEUES):
    a worker started without -Q consumes them all, and a test purges them all."""
    return [queue.name for queue in app.conf.task_queues]


def purge_queues(app) -> None:
    """Messages of an earlier test name rows that no longer exist."""
    with app.connection_for_write() as connection:
        for name in queue_names(app):
            connection.default_channel.queue_purge(name)
