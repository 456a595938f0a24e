"""A replica out of sync past a bound: a platform event, told once per
episode. In sync is the reconcile's answer (Replica.in_sync_since: set while
its polls find the replica up with nothing to repair, cleared otherwise). An
episode starts when this periodic check first sees a replica out of sync and
ends when it is back in sync; drift.found already tells each new drift, this
tells that the fleet has not healed itself within the bound."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from notifications.events import out_of_sync_draft
from notifications.models import SyncEpisode
from notifications.services.outbox import events_record_once

# Long enough for a reconcile to repair what it can (a tick every 10 s, a
# download and load of an adapter), short enough to matter to a person.
OUT_OF_SYNC_AFTER_SECONDS = 15 * 60


def out_of_sync_record(now=None) -> int:
    """Opens and closes episodes, and records the event of each that passed
    the bound and was not told; returns how many were recorded."""
    from serving.models import Replica

    now = now or timezone.now()
    out = set(
        Replica.objects.filter(
            active=True, in_sync_since__isnull=True, last_checked_at__isnull=False
        ).values_list("pk", flat=True)
    )
    with transaction.atomic():
        SyncEpisode.objects.exclude(replica_id__in=out).delete()
        known = set(SyncEpisode.objects.values_list("replica_id", flat=True))
        SyncEpisode.objects.bulk_create(
            [SyncEpisode(replica_id=pk, out_since=now) for pk in out - known],
            ignore_conflicts=True,
        )
    bound = timedelta(seconds=OUT_OF_SYNC_AFTER_SECONDS)
    due = SyncEpisode.objects.filter(out_since__lte=now - bound).select_related(
        "replica__deployment"
    )
    return events_record_once(
        [
            (
                f"replica.out_of_sync:{episode.replica_id}:{episode.out_since.isoformat()}",
                out_of_sync_draft(
                    episode.replica,
                    since=episode.out_since,
                    bound_seconds=OUT_OF_SYNC_AFTER_SECONDS,
                ),
            )
            for episode in due
        ]
    )
