"""Facts a replica reports about itself, recorded where they change."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from serving.models import Deployment, DriftKind, Replica
from serving.replica_facts import disputes
from serving.services.drifts import DriftRecorder


def replica_max_lora_report(deployment: Deployment, replica: Replica, max_lora: int) -> bool:
    """Records the max_lora a replica's /metrics shows; returns whether it changed.
    Unchanged costs nothing; a change that disputes the record is a drift."""
    facts = replica.reported_facts or {}
    if facts.get("max_lora") == max_lora:
        return False
    replica.reported_facts = {**facts, "max_lora": max_lora}
    drifts = DriftRecorder(deployment)
    with transaction.atomic():
        Replica.objects.filter(pk=replica.pk).update(reported_facts=replica.reported_facts)
        for dispute in disputes(deployment, [replica]):
            if dispute.fact == "max_loras":
                drifts.add(replica, DriftKind.FACT_DISPUTED, detail=dispute.message)
        drifts.flush(timezone.now())
    return True
