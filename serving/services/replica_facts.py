"""Facts a replica reports about itself, recorded where they change."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from serving.models import Deployment, DriftEvent, DriftKind, Replica
from serving.replica_facts import disputes


def replica_max_lora_report(deployment: Deployment, replica: Replica, max_lora: int) -> bool:
    """Records the max_lora a replica's /metrics shows; returns whether it changed.
    Unchanged costs nothing; a change that disputes the record is a drift."""
    facts = replica.reported_facts or {}
    if facts.get("max_lora") == max_lora:
        return False
    replica.reported_facts = {**facts, "max_lora": max_lora}
    now = timezone.now()
    with transaction.atomic():
        Replica.objects.filter(pk=replica.pk).update(reported_facts=replica.reported_facts)
        found = [d for d in disputes(deployment, [replica]) if d.fact == "max_loras"]
        DriftEvent.objects.bulk_create(
            DriftEvent(
                deployment=deployment,
                replica=replica,
                kind=DriftKind.FACT_DISPUTED,
                detail=d.message[:4000],
                last_seen_at=now,
            )
            for d in found
        )
    return True
