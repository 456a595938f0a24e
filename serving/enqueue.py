"""Where serving hands work to its Celery workers: one place, after the commit.

Each function sends its task with `transaction.on_commit` (HackSoft's
services do the same): a task never runs before the rows it reads exist,
and a rolled-back transaction sends nothing. Outside a transaction Django
runs the callback at once.

Tasks are sent by name: serving.tasks registers each under the name defined
here (and ServingConfig.ready imports it in every process). Importing the
tasks would close a circle (they import the engine, the sweeper and the
services, which enqueue through here), so the name is the shared piece, and a
reader finds the task from it (`name=RUN_ROLLOUT`).

A broker that is down loses nothing that matters: a rollout is committed and
the sweeper sends it again (serving.rollouts.sweep); a door's access sync is
caught up by door_access_tick; a reconcile by beat's next round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

RUN_ROLLOUT = "serving.run_rollout"
RECONCILE_DEPLOYMENT = "serving.reconcile_deployment"
DOOR_ACCESS_SYNC = "serving.door_access_sync"


def _send(task_name: str, *args: int) -> bool:
    """The task sent now; False (logged) where the broker did not take it.
    The task as registered (ServingConfig.ready imports serving.tasks in every
    process): its own `delay`, so eager mode and tests that watch it hold."""
    try:
        current_app.tasks[task_name].delay(*args)
    except Exception:  # kombu raises many types; any of them means "not sent"
        logger.warning("%s%s: enqueue failed", task_name, args, exc_info=True)
        return False
    return True


def rollout_send(rollout_id: int) -> bool:
    """The rollout's task, now (the sweeper, outside any transaction)."""
    return _send(RUN_ROLLOUT, rollout_id)


def rollout_enqueue(rollout_id: int) -> None:
    """A committed rollout waits for a worker (serving.rollouts.engine)."""
    transaction.on_commit(partial(rollout_send, rollout_id))


def reconcile_enqueue(deployment_id: int) -> None:
    """The deployment's replicas get what they should serve (new or returning
    replicas: serving.discovery.kubernetes)."""
    transaction.on_commit(partial(_send, RECONCILE_DEPLOYMENT, deployment_id))


def door_access_enqueue(deployment_ids: Iterable[int]) -> None:
    """What these deployments' front doors enforce changed (keys, grants, limits,
    what they serve): one door_access_sync per deployment after the commit."""
    ids = sorted(set(deployment_ids))

    def send() -> None:
        for deployment_id in ids:
            _send(DOOR_ACCESS_SYNC, deployment_id)

    if ids:
        transaction.on_commit(send)
