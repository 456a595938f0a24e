"""Observability's periodic work (beat: config/settings.py CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from observability.tokens import metered_requests_prune


@shared_task(name="observability.housekeeping", acks_late=True, ignore_result=True)
def housekeeping() -> dict:
    # Idempotent: a delivery run twice deletes nothing the second time.
    return {"pruned_metered_requests": metered_requests_prune()}
