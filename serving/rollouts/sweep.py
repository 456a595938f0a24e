"""The sweeper: no rollout stays unfinished because its task was lost.

A task is lost when the worker running it dies (its claim then expires within
SERVING_CLAIM_SECONDS), or when the broker refused it at commit. Every few
seconds beat runs `serving.sweep`, which sends again each unfinished rollout
that nobody holds a claim on and that was not sent in the last
SERVING_SWEEP_AFTER_SECONDS. Running a rollout twice is harmless (it resumes
from its recorded state), and two sweepers never send the same rollout twice
in one period: each takes the rollout with a compare-and-swap on enqueued_at.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from serving.enqueue import rollout_send
from serving.models import Rollout, ServedAdapter
from serving.records.leases import SERVED_ADAPTER_LEASE
from serving.rules.transitions import ROLLOUT_TERMINAL

logger = logging.getLogger(__name__)


def rollouts_to_sweep(now=None):
    """Unfinished rollouts that nobody works on and nobody sent recently."""
    now = now or timezone.now()
    quiet_since = now - timedelta(seconds=settings.SERVING_SWEEP_AFTER_SECONDS)
    held = ServedAdapter.objects.filter(
        deployment_id=OuterRef("deployment_id"), adapter_id=OuterRef("adapter_id")
    ).exclude(SERVED_ADAPTER_LEASE.free(now))
    return (
        Rollout.objects.exclude(status__in=ROLLOUT_TERMINAL)
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=quiet_since))
        .filter(~Exists(held))
        .order_by("created_at", "id")
    )


def sweep_rollouts(limit: int = 100) -> list[int]:
    """Sends again the rollouts that need it; returns their ids."""
    now = timezone.now()
    sent = []
    for rollout_id, enqueued_at in rollouts_to_sweep(now).values_list("pk", "enqueued_at")[:limit]:
        # Compare-and-swap: another sweeper (a second beat) that got here first wins.
        taken = Rollout.objects.filter(pk=rollout_id, enqueued_at=enqueued_at).update(
            enqueued_at=now
        )
        if taken and rollout_send(rollout_id):
            sent.append(rollout_id)
    if sent:
        logger.warning("sweeper re-enqueued rollouts %s", sent)
    return sent
