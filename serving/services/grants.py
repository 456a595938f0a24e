"""Grants: another department may call an adapter through the front door.

A member of the calling department asks (naming the adapter by its served
name, which the adapter's department told them); an approver of the ADAPTER's
department who did not ask approves or refuses (four eyes, audited); until its
end date, when the periodic tick expires it. Approvers of either side revoke.
Every move is a compare-and-swap on the status read (serving.transitions.
GRANT_TRANSITIONS), and the doors that serve the adapter are told after commit.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.access import can_approve, can_see, require_visible
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import Department
from core.state import move
from registry.models import Adapter
from serving.models import AdapterGrant, Deployment, GrantStatus, ServedAdapter
from serving.services.inference_keys import lifetime_days
from serving.signals import door_access_changed
from serving.transitions import GRANT_TRANSITIONS

logger = logging.getLogger(__name__)


def _require_person(actor: Actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot ask for, decide or revoke grants; a person must.",
            code="token_forbidden",
        )


def can_decide(actor: Actor, grant: AdapterGrant) -> bool:
    """Approvers of the adapter's department (and platform admins) who did not ask."""
    return (
        actor.token is None
        and can_approve(actor, grant.adapter.department_id)
        and grant.requested_by_id != actor.user.pk
    )


def can_revoke(actor: Actor, grant: AdapterGrant) -> bool:
    return actor.token is None and (
        can_approve(actor, grant.adapter.department_id) or can_approve(actor, grant.department_id)
    )


def require_visible_grant(actor: Actor, grant: AdapterGrant) -> None:
    """Both sides see it; anyone else gets a 404."""
    if not (can_see(actor, grant.department_id) or can_see(actor, grant.adapter.department_id)):
        raise NotFound("Grant not found.")


def grant_request(
    *,
    actor: Actor,
    department: Department,
    served_name: str,
    expires_in_days: int,
    reason: str = "",
) -> AdapterGrant:
    """`department` is the calling one; the actor must belong to it."""
    _require_person(actor)
    require_visible(actor, department.pk, "Department")
    days = lifetime_days(expires_in_days, settings.SERVING_GRANT_MAX_DAYS)
    adapter = Adapter.objects.select_related("department").filter(served_name=served_name).first()
    if adapter is None:
        raise NotFound(f"No adapter is served as {served_name!r}.", code="reference_not_found")
    if adapter.department_id == department.pk:
        raise ValidationFailed(
            f"{served_name} is {department.slug}'s own adapter: its keys call it without a grant.",
            code="own_adapter",
        )
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed("Say why the department needs it.", code="reason_required")
    try:
        with transaction.atomic():
            grant = AdapterGrant.objects.create(
                adapter=adapter,
                department=department,
                reason=reason[:2000],
                expires_at=timezone.now() + timedelta(days=days),
                requested_by=actor.user,
            )
            # Both sides' logs: the adapter's department is asked, the caller's asks.
            audit_record(
                actor=actor,
                action="grant.requested",
                obj=grant,
                department=adapter.department,
                to_state=GrantStatus.REQUESTED,
                comment=grant.reason,
                details={
                    "adapter": adapter.served_name,
                    "grantee": department.slug,
                    "expires_at": grant.expires_at.isoformat(),
                },
            )
    except IntegrityError:
        raise Conflict(
            f"{department.slug} already has a grant for {served_name} asked or approved.",
            code="grant_exists",
        ) from None
    return grant


def grant_decide(
    *, actor: Actor, grant: AdapterGrant, approve: bool, comment: str = ""
) -> AdapterGrant:
    """Four eyes: an approver of the adapter's department who did not ask."""
    _require_person(actor)
    require_visible_grant(actor, grant)
    adapter_department = grant.adapter.department
    if not can_approve(actor, adapter_department.pk):
        raise NotAuthorized(
            f"Only an approver of {adapter_department.slug} (the adapter's department) "
            "or a platform admin may decide this grant.",
            code="not_an_approver",
        )
    if grant.requested_by_id == actor.user.pk:
        raise NotAuthorized(
            "Four-eyes rule: you cannot approve or refuse your own grant request.",
            code="four_eyes",
        )
    comment = (comment or "").strip()
    if not approve and not comment:
        raise ValidationFailed("A comment is required to refuse.", code="comment_required")
    target = GrantStatus.APPROVED if approve else GrantStatus.REFUSED
    now = timezone.now()
    if grant.status != GrantStatus.REQUESTED:
        raise _not_open(grant.status)
    if approve and grant.expires_at <= now:
        raise Conflict(
            "This request's end date has passed; ask again.", code="grant_request_expired"
        )
    with transaction.atomic():
        if not move(
            grant, GRANT_TRANSITIONS, target, decided_by=actor.user, decided_at=now, comment=comment
        ):
            grant.refresh_from_db(fields=["status"])
            raise _not_open(grant.status)
        audit_record(
            actor=actor,
            action="grant.approved" if approve else "grant.refused",
            obj=grant,
            department=adapter_department,
            from_state=GrantStatus.REQUESTED,
            to_state=target,
            comment=comment,
            details={"adapter": grant.adapter.served_name, "grantee": grant.department.slug},
        )
        if approve:
            _doors_change(grant)
    return grant


def grant_revoke(*, actor: Actor, grant: AdapterGrant, comment: str = "") -> AdapterGrant:
    _require_person(actor)
    require_visible_grant(actor, grant)
    if not can_revoke(actor, grant):
        raise NotAuthorized(
            "Only an approver of the adapter's department or of the calling department "
            "(or a platform admin) may revoke a grant.",
            code="not_an_approver",
        )
    if grant.status != GrantStatus.APPROVED:
        raise Conflict(
            f"Only an approved grant can be revoked; this one is {grant.status}.",
            code="invalid_transition",
            details={"status": grant.status},
        )
    with transaction.atomic():
        if not move(
            grant,
            GRANT_TRANSITIONS,
            GrantStatus.REVOKED,
            ended_by=actor.user,
            ended_at=timezone.now(),
        ):
            grant.refresh_from_db(fields=["status"])
            raise _not_open(grant.status)
        audit_record(
            actor=actor,
            action="grant.revoked",
            obj=grant,
            department=grant.adapter.department,
            from_state=GrantStatus.APPROVED,
            to_state=GrantStatus.REVOKED,
            comment=(comment or "").strip(),
            details={"adapter": grant.adapter.served_name, "grantee": grant.department.slug},
        )
        _doors_change(grant)
    return grant


def grants_expire(now=None) -> int:
    """Moves every asked or approved grant past its end to expired (audited as
    the system) and tells the doors that serve their adapters. Returns how many."""
    now = now or timezone.now()
    due = AdapterGrant.objects.filter(
        status__in=[GrantStatus.REQUESTED, GrantStatus.APPROVED], expires_at__lte=now
    ).select_related("adapter__department", "department")
    expired = 0
    for grant in due:
        previous = grant.status
        with transaction.atomic():
            # Another tick, or a revoke, got there first: nothing to record.
            if not move(grant, GRANT_TRANSITIONS, GrantStatus.EXPIRED, ended_at=now):
                continue
            audit_record(
                actor=None,
                action="grant.expired",
                obj=grant,
                department=grant.adapter.department,
                from_state=previous,
                to_state=GrantStatus.EXPIRED,
                details={"adapter": grant.adapter.served_name, "grantee": grant.department.slug},
            )
            if previous == GrantStatus.APPROVED:
                _doors_change(grant)
        expired += 1
    return expired


def _not_open(status: str) -> Conflict:
    return Conflict(
        f"This grant is {status}; it can no longer be decided.",
        code="invalid_transition",
        details={"status": status},
    )


def _doors_change(grant: AdapterGrant) -> None:
    """The deployments that serve the grant's adapter."""
    door_access_changed.send(
        sender=Deployment,
        deployment_ids=ServedAdapter.objects.filter(
            adapter_id=grant.adapter_id, version__isnull=False
        ).values_list("deployment_id", flat=True),
    )
