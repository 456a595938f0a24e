"""Limits on what callers use at the front doors: a department's (set by
platform admins) and a key's (set by its department's approvers, never above
the department's own). Each change is validated, audited in its transaction,
and sent to every front door after commit, where it is in effect for the next
request (no reload). What the doors do with them: serving/rules/quotas.py."""

from __future__ import annotations

from django.db import transaction

from core.access import can_approve, require_visible
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotAuthorized, ValidationFailed
from core.models import Department
from serving.enqueue import door_access_enqueue
from serving.models import LIMIT_FIELDS, DepartmentLimits, Deployment, InferenceKey

KEY_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute")
# Bounds that keep a typo from reading as "no limit": 1e12 tokens is beyond
# any month of a shared GPU; the door's counters are 32-bit.
MAXIMUM = {
    "requests_per_minute": 10_000_000,
    "tokens_per_minute": 10**12,
    "tokens_per_day": 10**12,
    "tokens_per_month": 10**12,
}


def limits_checked(changes: dict, allowed: tuple[str, ...] = LIMIT_FIELDS) -> dict:
    """The changes, each a whole number in its bounds or None; else ValidationFailed
    naming the limit (for forms that check before they call a service)."""
    return _checked(changes, allowed)


def _checked(changes: dict, allowed: tuple[str, ...]) -> dict[str, int | None]:
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ValidationFailed(
            f"Unknown limit {', '.join(unknown)}; the limits are {', '.join(allowed)}.",
            code="bad_limit",
        )
    checked = {}
    for name, value in changes.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAXIMUM[name]
        ):
            raise ValidationFailed(
                f"{name} must be a whole number from 1 to {MAXIMUM[name]}, or null for no limit.",
                code="bad_limit",
                details={"field": name},
            )
        checked[name] = value
    return checked


def _values(row, names) -> dict[str, int | None]:
    return {name: getattr(row, name) for name in names}


def can_set_department_limits(actor: Actor) -> bool:
    return actor.is_platform_admin


def can_set_key_limits(actor: Actor, key: InferenceKey) -> bool:
    return can_approve(actor, key.department_id)


def department_limits_set(
    *, actor: Actor, department: Department, changes: dict
) -> DepartmentLimits:
    """Sets the named limits (None: no limit), leaves the others. Platform
    admins only. A key whose own limit is now above its department's keeps
    it: the department's count caps all its keys at the door all the same."""
    require_visible(actor, department.pk, "Department")
    if not can_set_department_limits(actor):
        raise NotAuthorized(
            "Only a platform admin sets a department's limits.", code="not_a_platform_admin"
        )
    checked = _checked(changes, LIMIT_FIELDS)
    with transaction.atomic():
        limits, _ = DepartmentLimits.objects.select_for_update(no_key=True).get_or_create(
            department=department
        )
        before = _values(limits, LIMIT_FIELDS)
        after = {**before, **checked}
        day, month = after["tokens_per_day"], after["tokens_per_month"]
        if day is not None and month is not None and day > month:
            raise ValidationFailed(
                f"tokens_per_day ({day}) is above tokens_per_month ({month}): "
                "a day's budget above the month's could never be spent.",
                code="bad_limit",
                details={"field": "tokens_per_day"},
            )
        if after == before:
            return limits
        for name, value in checked.items():
            setattr(limits, name, value)
        limits.updated_by = actor.user
        limits.full_clean()
        limits.save()
        audit_record(
            actor=actor,
            action="department_limits.changed",
            obj=limits,
            department=department,
            details={"before": before, "after": after},
        )
        _doors_change()
    return limits


def inference_key_limits_set(*, actor: Actor, key: InferenceKey, changes: dict) -> InferenceKey:
    """Sets the key's own limits (None: its department's alone), never above
    its department's. Approvers of its department and platform admins; a
    person, never a token."""
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot manage inference keys; sign in as a person.", code="token_forbidden"
        )
    if not can_set_key_limits(actor, key):
        raise NotAuthorized(
            "Only an approver of the key's department or a platform admin sets its limits.",
            code="not_an_approver",
        )
    checked = _checked(changes, KEY_LIMIT_FIELDS)
    with transaction.atomic():
        key = InferenceKey.objects.select_for_update(no_key=True).get(pk=key.pk)
        if key.revoked_at is not None:
            raise Conflict("This key is revoked.", code="already_revoked")
        ceiling = DepartmentLimits.objects.filter(department_id=key.department_id).first()
        for name, value in checked.items():
            top = getattr(ceiling, name, None)
            if value is not None and top is not None and value > top:
                raise ValidationFailed(
                    f"{name} {value} is above the department's own ({top}); "
                    "a platform admin sets the department's.",
                    code="above_department_limit",
                    details={"field": name},
                )
        before = _values(key, KEY_LIMIT_FIELDS)
        after = {**before, **checked}
        if after == before:
            return key
        InferenceKey.objects.filter(pk=key.pk).update(**checked)
        key.refresh_from_db()
        audit_record(
            actor=actor,
            action="inference_key.limits_changed",
            obj=key,
            department=key.department,
            details={"prefix": key.prefix, "before": before, "after": after},
        )
        _doors_change()
    return key


def _doors_change() -> None:
    """Limits apply at every door: all of them hear of it."""
    door_access_enqueue(Deployment.objects.values_list("pk", flat=True))
