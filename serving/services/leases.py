"""Claims on serving's work (core.claims): two workers never push the same
deployment's adapter at once, and two reconcilers never work on the same
deployment. A crashed holder's claim simply expires."""

from __future__ import annotations

from django.conf import settings

from core.claims import Lease
from serving.models import Deployment, ServedAdapter

SERVED_ADAPTER_LEASE = Lease(ServedAdapter, "lease_owner", "lease_until")
RECONCILE_LEASE = Lease(Deployment, "reconcile_lease_owner", "reconcile_lease_until")


def served_adapter_claim(served_id: int, owner: str) -> bool:
    return SERVED_ADAPTER_LEASE.claim(served_id, owner, settings.SERVING_LEASE_SECONDS)


def served_adapter_release(served_id: int, owner: str) -> None:
    SERVED_ADAPTER_LEASE.release(served_id, owner)


def deployment_reconcile_claim(deployment_id: int, owner: str) -> bool:
    return RECONCILE_LEASE.claim(deployment_id, owner, settings.SERVING_LEASE_SECONDS)


def deployment_reconcile_release(deployment_id: int, owner: str) -> None:
    RECONCILE_LEASE.release(deployment_id, owner)
