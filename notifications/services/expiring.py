"""Events no change causes: an inference key or a grant that ends within
EXPIRING_DAYS is told once (per subject and end date: a key's end moved later
is told again), by the periodic task, each in its own transaction."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from notifications.events import grant_draft, key_draft
from notifications.services.outbox import events_record_once

EXPIRING_DAYS = 7


def expiring_record(now=None) -> int:
    """Records the events of what ends soon and was not told yet; returns how many."""
    from serving.models import AdapterGrant, GrantStatus, InferenceKey

    now = now or timezone.now()
    horizon = now + timedelta(days=EXPIRING_DAYS)
    drafts = []
    keys = InferenceKey.objects.select_related("department").filter(
        revoked_at__isnull=True, expires_at__gt=now, expires_at__lte=horizon
    )
    for key in keys:
        drafts.append(
            (
                f"key.expiring:{key.pk}:{key.expires_at.isoformat()}",
                key_draft(
                    key, "key.expiring", f"expires on {key.expires_at:%Y-%m-%d}", actor="system"
                ),
            )
        )
    grants = AdapterGrant.objects.select_related("adapter__department", "department").filter(
        status=GrantStatus.APPROVED, expires_at__gt=now, expires_at__lte=horizon
    )
    for grant in grants:
        drafts.append(
            (
                f"grant.expiring:{grant.pk}:{grant.expires_at.isoformat()}",
                grant_draft(
                    grant, "grant.expiring", f"ends on {grant.expires_at:%Y-%m-%d}", actor="system"
                ),
            )
        )
    return events_record_once(drafts)
