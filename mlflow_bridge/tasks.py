"""Celery tasks for the MLflow mirror. Thin: each takes a row id and calls a
service. Transient failures (MLflow down) retry with exponential backoff;
permanent ones (MLflow refused the call) are recorded as failed at once."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from core.backoff import backoff_delay
from mlflow_bridge import mirror, webhooks
from mlflow_bridge.client import MlflowCallError
from mlflow_bridge.models import MlflowAliasMirror, MlflowVersionMirror

logger = logging.getLogger(__name__)


def backoff_seconds(retries: int) -> float:
    return backoff_delay(
        retries,
        base=settings.MLFLOW_MIRROR_BACKOFF_SECONDS,
        cap=settings.MLFLOW_MIRROR_BACKOFF_MAX_SECONDS,
        jitter=True,
    )


def _run(task, model, pk: int, sync, argument: str) -> str:
    try:
        return sync(**{argument: pk})
    except MlflowCallError as error:
        if error.transient and task.request.is_eager:
            # Run inline (tests, CELERY_TASK_ALWAYS_EAGER): retrying here would only
            # hold up the caller. The row stays pending for the catch-up task.
            logger.info("MLflow mirror %s %s: %s; left pending", model.__name__, pk, error.message)
            return "pending"
        if error.transient and task.request.retries < settings.MLFLOW_MIRROR_MAX_RETRIES:
            logger.info("MLflow mirror %s %s: %s; retrying", model.__name__, pk, error.message)
            raise task.retry(
                countdown=backoff_seconds(task.request.retries),
                max_retries=settings.MLFLOW_MIRROR_MAX_RETRIES,
            ) from None
        mirror.mirror_mark_failed(model, pk, error.message)
        logger.warning("MLflow mirror %s %s failed: %s", model.__name__, pk, error.message)
        return "failed"


@shared_task(name="mlflow_bridge.sync_version", bind=True, acks_late=True, max_retries=None)
def sync_version_mirror(self, mirror_id: int) -> str:
    return _run(self, MlflowVersionMirror, mirror_id, mirror.mirror_version_sync, "mirror_id")


@shared_task(name="mlflow_bridge.sync_alias", bind=True, acks_late=True, max_retries=None)
def sync_alias_mirror(self, alias_id: int) -> str:
    return _run(self, MlflowAliasMirror, alias_id, mirror.mirror_alias_sync, "alias_id")


@shared_task(name="mlflow_bridge.catch_up", acks_late=True, ignore_result=True)
def catch_up() -> dict:
    """Sends again every mirror row whose backoff has passed and every accepted
    webhook delivery nobody finished."""
    versions, aliases = mirror.mirror_due()
    for pk in versions:
        sync_version_mirror.delay(pk)
    for pk in aliases:
        sync_alias_mirror.delay(pk)
    stale = webhooks.webhook_stale()
    for pk in stale:
        handle_webhook.delay(pk)
    return {
        "versions": len(versions),
        "aliases": len(aliases),
        "webhooks": len(stale),
        "webhook_refusals_audited": webhooks.webhook_refusals_audit(),
    }


@shared_task(
    name="mlflow_bridge.handle_webhook",
    bind=True,
    acks_late=True,
    max_retries=8,
)
def handle_webhook(self, delivery_id: int) -> str:
    """Registers what an accepted MLflow webhook delivery names (mlflow_bridge/webhooks.py).
    MLflow unreachable: retried with backoff; the delivery stays accepted meanwhile."""

    try:
        return webhooks.webhook_handle(delivery_id=delivery_id)
    except Exception as error:
        if self.request.is_eager or self.request.retries >= self.max_retries:
            raise
        logger.info("MLflow webhook delivery %s: %s; retrying", delivery_id, error)
        raise self.retry(countdown=backoff_seconds(self.request.retries)) from error
