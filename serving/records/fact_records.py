"""Fact records: the facts a replica reports about itself, stored where they change
(the replica's `reported_facts`), a dispute with the record kept as a drift."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from serving.fact_readings import REPORTED_FLAGS, disputes, max_lora_rank_from_refusal
from serving.models import Deployment, DriftKind, Replica
from serving.records.drifts import DriftRecorder


def replica_load_refusals_report(deployment: Deployment, errors: dict[Replica, str]) -> None:
    """Loads a replica refused: where the error names the server's max_lora_rank
    (a rank above it), that is a fact the replica reports."""
    for replica, error in errors.items():
        rank = max_lora_rank_from_refusal(error)
        if rank is not None:
            _report(deployment, replica, "max_lora_rank", rank)


def _report(deployment, replica, fact: str, value) -> bool:
    flag = next(f for f in REPORTED_FLAGS if f.fact == fact)
    facts = replica.reported_facts or {}
    if facts.get(fact) == value:
        return False
    replica.reported_facts = {**facts, fact: value}
    drifts = DriftRecorder(deployment)
    with transaction.atomic():
        Replica.objects.filter(pk=replica.pk).update(reported_facts=replica.reported_facts)
        for dispute in disputes(deployment, [replica]):
            if dispute.fact == flag.field:
                drifts.add(replica, DriftKind.FACT_DISPUTED, detail=dispute.message)
        drifts.flush(timezone.now())
    return True
