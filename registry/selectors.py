"""Reads, always through the actor's visibility. Querysets come back with the
joins they need, so list pages run a constant number of queries."""

from __future__ import annotations

from django.db.models import Prefetch, Q, QuerySet

from core.access import (
    approver_department_ids,
    require_visible,
    token_may,
    visible_department_ids,
)
from core.actors import Actor
from core.errors import NotFound
from core.models import Ability, ApiToken, AuditEvent, Department, Membership
from registry.models import Adapter, AdapterVersion, VersionStatus


def _restrict(queryset: QuerySet, actor: Actor, field: str) -> QuerySet:
    ids = visible_department_ids(actor)
    if ids is None:
        return queryset
    return queryset.filter(**{f"{field}__in": ids})


def departments_for(actor: Actor) -> QuerySet[Department]:
    return _restrict(Department.objects.all(), actor, "id")


def department_get(actor: Actor, slug: str) -> Department:
    department = departments_for(actor).filter(slug=slug).first()
    if department is None:
        raise NotFound(f"Department {slug!r} not found.")
    return department


def memberships_for(actor: Actor) -> QuerySet[Membership]:
    if not token_may(actor, Ability.READ_AUDIT):
        return Membership.objects.none()
    return _restrict(
        Membership.objects.select_related("user", "department"), actor, "department_id"
    )


def adapters_for(actor: Actor) -> QuerySet[Adapter]:
    return _restrict(
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
    return _restrict(
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


def audit_events_for(actor: Actor) -> QuerySet[AuditEvent]:
    if not token_may(actor, Ability.READ_AUDIT):
        return AuditEvent.objects.none()
    queryset = AuditEvent.objects.select_related("department", "actor", "actor_token")
    ids = visible_department_ids(actor)
    if ids is None:
        return queryset
    # People also see events about themselves that belong to no department.
    return queryset.filter(department_id__in=ids)


def tokens_for(actor: Actor) -> QuerySet[ApiToken]:
    queryset = ApiToken.objects.select_related("department", "created_by", "revoked_by")
    if actor.is_platform_admin:
        return queryset
    if actor.token is not None:
        return queryset.none()
    # A service account's tokens belong to its department: its approvers see them all.
    departments = approver_department_ids(actor) or set()
    return queryset.filter(
        Q(created_by=actor.user) | Q(service_account__isnull=False, department_id__in=departments)
    )


def token_get(actor: Actor, token_id: int) -> ApiToken:
    token = tokens_for(actor).filter(pk=token_id).first()
    if token is None:
        raise NotFound("Token not found.")
    return token


def require_department_visible(actor: Actor, department: Department) -> None:
    require_visible(actor, department.pk, "Department")
