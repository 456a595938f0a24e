"""Claims on serving's work (core.claims): two workers never push the same
deployment's adapter at once, and two reconcilers never work on the same
deployment. Claims are short (SERVING_CLAIM_SECONDS) and renewed by a
heartbeat while the work goes on, so a crashed holder's claim expires within
seconds and the sweeper (serving.rollouts.sweep) hands the work on."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from core.claims import Heartbeat, Lease
from serving.models import Deployment, ServedAdapter

SERVED_ADAPTER_LEASE = Lease(ServedAdapter, "lease_owner", "lease_until")
RECONCILE_LEASE = Lease(Deployment, "reconcile_lease_owner", "reconcile_lease_until")


def claim_seconds() -> float:
    return settings.SERVING_CLAIM_SECONDS


def served_adapter_claim(served_id: int, owner: str) -> bool:
    return SERVED_ADAPTER_LEASE.claim(served_id, owner, claim_seconds())


def served_adapter_heartbeat(served_id: int, owner: str) -> Heartbeat:
    return Heartbeat(SERVED_ADAPTER_LEASE, served_id, owner, claim_seconds())


def served_adapter_release(served_id: int, owner: str) -> None:
    SERVED_ADAPTER_LEASE.release(served_id, owner)


def served_adapter_release_if_expired(served_id: int) -> bool:
    """Clears a dead holder's claim (a live holder renews before it expires)."""
    cleared = ServedAdapter.objects.filter(pk=served_id, lease_until__lt=timezone.now()).update(
        lease_owner="", lease_until=None
    )
    return cleared == 1


def deployment_reconcile_claim(deployment_id: int, owner: str) -> bool:
    return RECONCILE_LEASE.claim(deployment_id, owner, claim_seconds())


def deployment_reconcile_heartbeat(deployment_id: int, owner: str) -> Heartbeat:
    return Heartbeat(RECONCILE_LEASE, deployment_id, owner, claim_seconds())


def deployment_reconcile_release(deployment_id: int, owner: str, **also) -> None:
    RECONCILE_LEASE.release(deployment_id, owner, **also)


def served_adapters_claim(served_ids, owner: str) -> set[int]:
    return SERVED_ADAPTER_LEASE.claim_many(served_ids, owner, claim_seconds())


def served_adapters_renew(served_ids, owner: str) -> None:
    SERVED_ADAPTER_LEASE.renew_many(served_ids, owner, claim_seconds())


def served_adapters_release(served_ids, owner: str) -> None:
    SERVED_ADAPTER_LEASE.release_many(served_ids, owner)
