"""The control plane's own requests through adapters (verification, the
weight check), recorded so that vLLM's /metrics, which lists them like
clients' requests, never makes them demand (serving.models.OwnProbe).

Recorded in the database, not in memory: the worker that probes is often
not the one that next reads /metrics, and may die in between.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from serving.models import OwnProbe, Replica


def own_probes_record(replicas: Iterable[Replica], names: Iterable[str]) -> None:
    """Marks `names` as probed now on each replica: before the probes are sent
    (a worker dying after sending them leaves the mark) and again once they
    answered (the grace counts from the last probe). One upsert."""
    names = list(dict.fromkeys(names))
    own_probes_record_each((replica, name) for replica in replicas for name in names)


def own_probes_record_each(pairs: Iterable[tuple[Replica, str]]) -> None:
    """own_probes_record for (replica, adapter name) pairs."""
    now = timezone.now()
    rows = [
        OwnProbe(replica_id=replica_id, served_name=name, probed_at=now)
        for replica_id, name in dict.fromkeys((replica.pk, name) for replica, name in pairs)
    ]
    if rows:
        OwnProbe.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["replica", "served_name"],
            update_fields=["probed_at"],
        )


def own_probes_marked(replica_ids: Iterable[int]) -> dict[int, dict[str, datetime]]:
    """Per replica id, the adapters marked as probed there, with when."""
    marked: dict[int, dict[str, datetime]] = {}
    rows = OwnProbe.objects.filter(replica_id__in=list(replica_ids)).values_list(
        "replica_id", "served_name", "probed_at"
    )
    for replica_id, name, probed_at in rows:
        marked.setdefault(replica_id, {})[name] = probed_at
    return marked


def own_probes_settle(marked: dict[int, dict[str, datetime]], read_at: datetime) -> int:
    """After a read of those replicas' /metrics that began at `read_at`: the
    marks whose last probe was more than the grace before it are done with
    (that read saw whatever the probes left). Compare-and-swap on probed_at:
    a probe recorded since is kept for the next read. Returns how many went."""
    cutoff = read_at - timedelta(seconds=settings.SERVING_OWN_PROBE_GRACE_SECONDS)
    gone = 0
    for replica_id, names in marked.items():
        for name, probed_at in names.items():
            if probed_at < cutoff:
                gone += OwnProbe.objects.filter(
                    replica_id=replica_id, served_name=name, probed_at=probed_at
                ).delete()[0]
    return gone
