"""The one recorder of drift: what the reconcile and a replica's reported facts
find wrong is written here, counted when it repeats."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F, Max

from serving.models import Deployment, DriftEvent
from serving.signals import drift_found

logger = logging.getLogger(__name__)


class DriftRecorder:
    """Drift found during a tick (or by one reading of a replica), written at
    its end in a few statements: an event equal to the latest one of the same
    replica and adapter (same kind, paths and detail) is that event seen again,
    so it is counted, not repeated. The one writer of DriftEvents."""

    def __init__(self, deployment: Deployment):
        self.deployment = deployment
        self.pending: list[DriftEvent] = []

    def add(self, replica, kind, adapter_name="", expected="", actual="", detail="") -> None:
        self.pending.append(
            DriftEvent(
                deployment=self.deployment,
                replica=replica,
                kind=kind,
                adapter_name=adapter_name,
                expected_root=expected or "",
                actual_root=actual or "",
                detail=(detail or "")[:4000],
            )
        )
        logger.info("drift %s on %s: %s %s", kind, replica.base_url, adapter_name, detail)

    def flush(self, now) -> None:
        if not self.pending:
            return
        replica_ids = {e.replica_id for e in self.pending}
        names = {e.adapter_name for e in self.pending}
        latest_ids = (
            DriftEvent.objects.filter(replica_id__in=replica_ids, adapter_name__in=names)
            .values("replica_id", "adapter_name")
            .annotate(last=Max("pk"))
            .values("last")
        )
        latest = {
            (e.replica_id, e.adapter_name): e
            for e in DriftEvent.objects.filter(pk__in=latest_ids).only(
                "replica_id", "adapter_name", "kind", "expected_root", "actual_root", "detail"
            )
        }
        repeated, new = [], []
        for event in self.pending:
            last = latest.get((event.replica_id, event.adapter_name))
            same = last is not None and (
                last.kind,
                last.expected_root,
                last.actual_root,
                last.detail,
            ) == (event.kind, event.expected_root, event.actual_root, event.detail)
            if same and last is not None:
                repeated.append(last.pk)
            else:
                event.last_seen_at = now
                new.append(event)
        if repeated:
            DriftEvent.objects.filter(pk__in=repeated).update(
                count=F("count") + 1, last_seen_at=now
            )
        if new:
            # With what other apps record of it (the notifications outbox), or neither.
            with transaction.atomic():
                DriftEvent.objects.bulk_create(new)
                drift_found.send(sender=DriftEvent, events=new)
