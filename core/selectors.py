"""Reads of core's own rows (departments, memberships, audit events, tokens),
always through the actor's visibility."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from core.access import (
    approver_department_ids,
    require_visible,
    token_may,
    visible_department_ids,
)
from core.actors import Actor
from core.errors import NotFound
from core.models import Ability, ApiToken, AuditEvent, Department, Membership


def restrict_to_visible(queryset: QuerySet, actor: Actor, field: str) -> QuerySet:
    ids = visible_department_ids(actor)
    if ids is None:
        return queryset
    return queryset.filter(**{f"{field}__in": ids})


def departments_for(actor: Actor) -> QuerySet[Department]:
    return restrict_to_visible(Department.objects.all(), actor, "id")


def department_get(actor: Actor, slug: str) -> Department:
    department = departments_for(actor).filter(slug=slug).first()
    if department is None:
        raise NotFound(f"Department {slug!r} not found.")
    return department


def memberships_for(actor: Actor) -> QuerySet[Membership]:
    if not token_may(actor, Ability.READ_AUDIT):
        return Membership.objects.none()
    return restrict_to_visible(
        Membership.objects.select_related("user", "department"), actor, "department_id"
    )


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
