"""Celery tasks: thin, idempotent, each loads ids and calls one service."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from serving.models import Deployment, HttpAttempt
from serving.services.reconcile import reconcile_deployment
from serving.services.rollout_engine import LeaseBusy, rollout_execute
from serving.services.sweep import sweep_rollouts
from serving.volume import collect_garbage

logger = logging.getLogger(__name__)


def worker_id(task_id: str | None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or 'eager'}"[:100]


@shared_task(
    name="serving.run_rollout",
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
    """Re-enqueues rollouts whose task was lost (serving.services.sweep)."""
    return sweep_rollouts()


@shared_task(name="serving.reconcile_deployment", bind=True, acks_late=True)
def reconcile_one(self, deployment_id: int) -> dict:
    report = reconcile_deployment(deployment_id, worker_id(self.request.id))
    return {"deployment": report.deployment, "skipped": report.skipped, "repairs": report.repairs}


@shared_task(name="serving.reconcile_all", acks_late=True)
def reconcile_all() -> int:
    ids = list(Deployment.objects.values_list("pk", flat=True))
    for deployment_id in ids:
        reconcile_one.delay(deployment_id)
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
