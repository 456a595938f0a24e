"""Reads, always through the actor's visibility. Querysets come back with the
joins they need, so list pages run a constant number of queries."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from core.access import approver_department_ids
from core.actors import Actor
from core.errors import NotFound
from core.selectors import restrict_to_visible
from registry.models import Adapter, AdapterVersion, VersionStatus


def adapters_for(actor: Actor) -> QuerySet[Adapter]:
    return restrict_to_visible(
        Adapter.objects.select_related("department", "created_by").prefetch_related(
            Prefetch("owners")
        ),
        actor,
        "department_id",
    )


def adapter_get(actor: Actor, adapter_id: int) -> Adapter:
    adapter = adapters_for(actor).filter(pk=adapter_id).first()
    if adapter is None:
        raise NotFound("Adapter not found.")
    return adapter


def versions_for(actor: Actor) -> QuerySet[AdapterVersion]:
    return restrict_to_visible(
        AdapterVersion.objects.select_related(
            "adapter__department", "registered_by", "submitted_by", "reviewed_by"
        ),
        actor,
        "adapter__department_id",
    )


def version_get(actor: Actor, version_id: int) -> AdapterVersion:
    version = versions_for(actor).filter(pk=version_id).first()
    if version is None:
        raise NotFound("Version not found.")
    return version


def pending_reviews_for(actor: Actor) -> QuerySet[AdapterVersion]:
    """Versions waiting in departments where the actor approves."""
    queryset = versions_for(actor).filter(status=VersionStatus.PENDING_REVIEW)
    ids = approver_department_ids(actor)
    if ids is not None:
        queryset = queryset.filter(adapter__department_id__in=ids)
    return queryset.order_by("created_at")


def current_approved_version(adapter: Adapter) -> AdapterVersion | None:
    return adapter.versions.filter(status=VersionStatus.APPROVED).order_by("-number").first()
