"""Leases: a conditional UPDATE claims work, so two workers never push the
same deployment's adapter at once, and two reconcilers never work on the same
deployment. A crashed holder's lease simply expires."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from serving.models import Deployment, ServedAdapter


def _claim(model, pk: int, owner: str, owner_field: str, until_field: str) -> bool:
    now = timezone.now()
    free = (
        Q(**{f"{until_field}__isnull": True})
        | Q(**{f"{until_field}__lt": now})
        | Q(**{owner_field: owner})
    )
    claimed = (
        model.objects.filter(pk=pk)
        .filter(free)
        .update(
            **{
                owner_field: owner,
                until_field: now + timedelta(seconds=settings.SERVING_LEASE_SECONDS),
            }
        )
    )
    return claimed == 1


def _release(model, pk: int, owner: str, owner_field: str, until_field: str) -> None:
    model.objects.filter(pk=pk, **{owner_field: owner}).update(
        **{owner_field: "", until_field: None}
    )


def served_adapter_claim(served_id: int, owner: str) -> bool:
    return _claim(ServedAdapter, served_id, owner, "lease_owner", "lease_until")


def served_adapter_release(served_id: int, owner: str) -> None:
    _release(ServedAdapter, served_id, owner, "lease_owner", "lease_until")


def deployment_reconcile_claim(deployment_id: int, owner: str) -> bool:
    return _claim(
        Deployment, deployment_id, owner, "reconcile_lease_owner", "reconcile_lease_until"
    )


def deployment_reconcile_release(deployment_id: int, owner: str) -> None:
    _release(Deployment, deployment_id, owner, "reconcile_lease_owner", "reconcile_lease_until")
