"""Celery tasks: thin, idempotent, each loads ids and calls one service."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from serving.enqueue import (
    DOOR_ACCESS_SYNC,
    RECONCILE_DEPLOYMENT,
    RUN_ROLLOUT,
    door_access_enqueue,
    reconcile_enqueue,
)
from serving.models import Deployment, HttpAttempt
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import LeaseBusy, rollout_execute
from serving.rollouts.sweep import sweep_rollouts
from serving.volume import collect_garbage

logger = logging.getLogger(__name__)


def worker_id(task_id: str | None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or 'eager'}"[:100]


@shared_task(
    name=RUN_ROLLOUT,
    bind=True,
    acks_late=True,
    max_retries=60,
    autoretry_for=(LeaseBusy,),
    retry_backoff=2,
    retry_backoff_max=30,
)
def run_rollout(self, rollout_id: int) -> str:
    return rollout_execute(rollout_id, worker_id(self.request.id))


@shared_task(name="serving.sweep", acks_late=True, ignore_result=True)
def sweep() -> list[int]:
    """Re-enqueues rollouts whose task was lost (serving.rollouts.sweep)."""
    return sweep_rollouts()


@shared_task(name=RECONCILE_DEPLOYMENT, bind=True, acks_late=True)
def reconcile_one(self, deployment_id: int) -> dict:
    report = reconcile_deployment(deployment_id, worker_id(self.request.id))
    return {"deployment": report.deployment, "skipped": report.skipped, "repairs": report.repairs}


@shared_task(name="serving.reconcile_all", acks_late=True)
def reconcile_all() -> int:
    ids = list(Deployment.objects.values_list("pk", flat=True))
    for deployment_id in ids:
        reconcile_enqueue(deployment_id)
    return len(ids)


@shared_task(name="serving.housekeeping", acks_late=True)
def housekeeping() -> dict:
    from registry.services.retention import retention_apply

    deleted = collect_garbage()
    artifacts_deleted = retention_apply()
    cutoff = timezone.now() - timedelta(days=settings.SERVING_ATTEMPT_RETENTION_DAYS)
    # Rollout attempts are history worth keeping; reconcile polls are not.
    pruned, _ = HttpAttempt.objects.filter(
        replica_rollout__isnull=True, started_at__lt=cutoff
    ).delete()
    return {
        "deleted_folders": deleted,
        "pruned_attempts": pruned,
        "versions_artifacts_deleted": artifacts_deleted,
    }


# --- Who may call what, at the front doors -----------------------------------


@shared_task(name=DOOR_ACCESS_SYNC, acks_late=True, ignore_result=True)
def door_access_sync(deployment_id: int) -> bool:
    """Gives the deployment's front door its access table as the database has it
    now (a whole table each time: idempotent, and a late one is never stale)."""
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        return False
    # Imported here, late, as the other tasks import their services.
    from serving.door.services import door_sync_access

    door_sync_access(deployment)
    return True


@shared_task(name="serving.door_access_tick", acks_late=True, ignore_result=True)
def door_access_tick() -> int:
    """Expires the grants past their end (their doors are told), then sends every
    front door its table again: a sync lost with a broker that was down, or a
    key past its expiry, is caught up within one tick. Returns the grants expired."""
    from serving.services.grants import grants_expire

    expired = grants_expire()
    door_access_enqueue(
        Deployment.objects.filter(name__in=list(settings.SERVING_DOORS)).values_list(
            "pk", flat=True
        )
    )
    return expired
