"""Sending the app's tasks after the commit, in one place. Services name a task
and never import notifications.tasks (which imports the services): the task is
looked up in the Celery app's registry by name.

A broker that is down loses nothing: the rows stay due and the sweeper
(tasks.sweep) sends them again."""

from __future__ import annotations

import logging

from django.db import transaction

logger = logging.getLogger(__name__)


def _send(task_name: str, ids: list[int]) -> None:
    from celery import current_app

    task = current_app.tasks[f"notifications.{task_name}"]
    for pk in ids:
        try:
            task.delay(pk)
        except Exception:  # kombu raises many types; any of them means "not sent"
            logger.warning("%s %s: enqueue failed; the sweeper will send it", task_name, pk)


def after_commit(task_name: str, ids) -> None:
    ids = list(ids)
    if ids:
        transaction.on_commit(lambda: _send(task_name, ids))
