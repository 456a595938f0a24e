"""Grants: another department may call an adapter through the front door.

A member of the calling department asks (naming the adapter by its served
name, which the adapter's department told them); an approver of the ADAPTER's
department who did not ask approves or refuses (four eyes, audited); until its
end date, when the periodic tick expires it. Approvers of either side revoke.
Every move is a compare-and-swap on the status read (serving.rules.transitions.
GRANT_TRANSITIONS), and the doors that serve the adapter are told after commit.

A request for a name no adapter has is answered exactly as one for another
department's adapter (201, the same row, "requested"), so that asking cannot
tell which names exist. It names no adapter: only the asking department sees
it, nobody can approve it, and the tick expires it. Bad input is refused before
the name is looked up, so the order of the checks tells nothing either.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.access import (
    can_approve,
    can_review,
    can_see,
    require_four_eyes,
    require_visible,
)
from core.actors import Actor
from core.audit import audit_event, audit_record, audit_record_all
from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import Department
from core.state import move
from registry.models import Adapter, served_name_validator
from serving.enqueue import door_access_enqueue
from serving.models import AdapterGrant, GrantStatus, ServedAdapter
from serving.rules.transitions import GRANT_TRANSITIONS
from serving.services.inference_keys import lifetime_days

logger = logging.getLogger(__name__)


def _require_person(actor: Actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot ask for, decide or revoke grants; a person must.",
            code="token_forbidden",
        )


FOUR_EYES_GRANT = "Four-eyes rule: you cannot approve or refuse a grant request you are behind."


def can_decide(actor: Actor, grant: AdapterGrant) -> bool:
    """Approvers of the adapter's department (and platform admins) who are none
    of the people behind the request (four eyes on people, as versions and
    promotions: core.access.can_review). Nobody, for a request that names no adapter."""
    return (
        actor.token is None
        and grant.adapter is not None
        and can_approve(actor, grant.adapter.department_id)
        and can_review(actor, grant.authors)
    )


def can_revoke(actor: Actor, grant: AdapterGrant) -> bool:
    return actor.token is None and (
        can_approve(actor, grant.department_id)
        or (grant.adapter is not None and can_approve(actor, grant.adapter.department_id))
    )


def require_visible_grant(actor: Actor, grant: AdapterGrant) -> None:
    """Both sides see it (only the asking one when it names no adapter); anyone
    else gets a 404."""
    if not (
        can_see(actor, grant.department_id)
        or (grant.adapter is not None and can_see(actor, grant.adapter.department_id))
    ):
        raise NotFound("Grant not found.")


def grant_request(
    *,
    actor: Actor,
    department: Department,
    served_name: str,
    expires_in_days: int,
    reason: str = "",
) -> AdapterGrant:
    """`department` is the calling one; the actor must belong to it. A name no
    adapter has is accepted like any other (see the module's docstring)."""
    _require_person(actor)
    require_visible(actor, department.pk, "Department")
    # Everything that does not depend on the name existing comes first.
    days = lifetime_days(expires_in_days, settings.SERVING_GRANT_MAX_DAYS)
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed("Say why the department needs it.", code="reason_required")
    served_name = (served_name or "").strip()
    try:
        served_name_validator(served_name)
    except ValidationError:
        raise ValidationFailed(
            f"{served_name!r} is not a served name: {served_name_validator.message}",
            code="bad_served_name",
        ) from None
    adapter = Adapter.objects.select_related("department").filter(served_name=served_name).first()
    # The asking department's members see its adapters anyway: nothing to hide.
    if adapter is not None and adapter.department_id == department.pk:
        raise ValidationFailed(
            f"{served_name} is {department.slug}'s own adapter: its keys call it without a grant.",
            code="own_adapter",
        )
    try:
        with transaction.atomic():
            grant = AdapterGrant.objects.create(
                adapter=adapter,
                served_name=served_name,
                department=department,
                reason=reason[:2000],
                expires_at=timezone.now() + timedelta(days=days),
                requested_by=actor.user,
                author_ids=sorted(actor.people),
            )
            details = {
                "adapter": served_name,
                "grantee": department.slug,
                "expires_at": grant.expires_at.isoformat(),
            }
            # The asking department's log has every request, the same whatever
            # the name; the adapter's department's log (when there is one) is
            # asked too, and that event is the one that tells its approvers.
            audit_record_all(
                [
                    audit_event(
                        actor=actor,
                        action="grant.requested",
                        obj=grant,
                        department=log,
                        to_state=GrantStatus.REQUESTED,
                        comment=grant.reason,
                        details=details,
                    )
                    for log in _logs_of(grant)
                ]
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
    if grant.adapter is None:
        # Asked for a name no adapter has: nobody's to approve, platform admins'
        # included. Said as to anyone who may not decide, so it tells nothing.
        raise NotAuthorized(
            "Only an approver of the adapter's department or a platform admin "
            "may decide this grant.",
            code="not_an_approver",
        )
    adapter_department = grant.adapter.department
    if not can_approve(actor, adapter_department.pk):
        # The asking side is not told whose adapter it is: a request for a name
        # no adapter has gets this same answer.
        raise NotAuthorized(
            "Only an approver of the adapter's department or a platform admin "
            "may decide this grant.",
            code="not_an_approver",
        )
    require_four_eyes(actor, grant.authors, FOUR_EYES_GRANT)
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
    adapter = grant.adapter
    # A grant with no adapter is never approved: the same answer.
    if grant.status != GrantStatus.APPROVED or adapter is None:
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
            department=adapter.department,
            from_state=GrantStatus.APPROVED,
            to_state=GrantStatus.REVOKED,
            comment=(comment or "").strip(),
            details={"adapter": adapter.served_name, "grantee": grant.department.slug},
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
            # Both logs, as the request: an unanswered request for a name no
            # adapter has ends in the asking department's log like any other.
            audit_record_all(
                [
                    audit_event(
                        actor=None,
                        action="grant.expired",
                        obj=grant,
                        department=department,
                        from_state=previous,
                        to_state=GrantStatus.EXPIRED,
                        details={"adapter": grant.served_name, "grantee": grant.department.slug},
                    )
                    for department in _logs_of(grant)
                ]
            )
            if previous == GrantStatus.APPROVED:
                _doors_change(grant)
        expired += 1
    return expired


def grants_end_with_adapter(adapter: Adapter, now=None) -> int:
    """Ends the asked and approved grants of an adapter that is served nowhere
    any more (its last deployment retired it): as expired, audited as the system.
    A grant was agreed for what was served then; serving the adapter again (a
    new version, perhaps another use) asks again, rather than reviving it.
    Returns how many ended. Called in the retire's transaction."""
    if ServedAdapter.objects.filter(adapter=adapter, version__isnull=False).exists():
        return 0
    now = now or timezone.now()
    ended = 0
    live = AdapterGrant.objects.filter(
        adapter=adapter, status__in=[GrantStatus.REQUESTED, GrantStatus.APPROVED]
    ).select_related("adapter__department", "department")
    for grant in live:
        previous = grant.status
        if not move(grant, GRANT_TRANSITIONS, GrantStatus.EXPIRED, ended_at=now):
            continue  # a revoke or the tick got there first
        # Both logs, as the tick's expiry.
        audit_record_all(
            [
                audit_event(
                    actor=None,
                    action="grant.expired",
                    obj=grant,
                    department=department,
                    from_state=previous,
                    to_state=GrantStatus.EXPIRED,
                    comment="The adapter was retired from every deployment.",
                    details={
                        "adapter": adapter.served_name,
                        "grantee": grant.department.slug,
                        "reason": "adapter_retired",
                    },
                )
                for department in _logs_of(grant)
            ]
        )
        ended += 1
    return ended


def _logs_of(grant: AdapterGrant) -> list[Department]:
    """The departments whose logs record its request and its expiry: the asking
    one, then the adapter's when it names one (that event tells its people:
    notifications.events)."""
    if grant.adapter is None:
        return [grant.department]
    return [grant.department, grant.adapter.department]


def _not_open(status: str) -> Conflict:
    return Conflict(
        f"This grant is {status}; it can no longer be decided.",
        code="invalid_transition",
        details={"status": status},
    )


def _doors_change(grant: AdapterGrant) -> None:
    """The deployments that serve the grant's adapter (none without one)."""
    if grant.adapter_id is None:
        return
    door_access_enqueue(
        ServedAdapter.objects.filter(
            adapter_id=grant.adapter_id, version__isnull=False
        ).values_list("deployment_id", flat=True),
    )
