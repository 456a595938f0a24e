from __future__ import annotations

from typing import cast

from django.contrib.auth import get_user_model
from django.db import transaction

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotFound, ValidationFailed
from core.models import Department, Membership, Role
from core.signals import membership_changed

# department_update: a field not given is left as it is (None is a value: keep forever).
UNCHANGED = object()


def department_create(*, actor: Actor, slug: str, name: str) -> Department:
    require_platform_admin(actor)
    department = Department(slug=slug, name=name)
    # A duplicate is a conflict (409), not bad input: checked here and by the database.
    department.full_clean(validate_unique=False)
    if Department.objects.filter(slug=slug).exists():
        raise Conflict(f"A department {slug!r} already exists.", code="duplicate_slug")
    with transaction.atomic():
        department.save()
        audit_record(
            actor=actor,
            action="department.created",
            obj=department,
            department=department,
        )
    return department


def department_update(
    *,
    actor: Actor,
    department: Department,
    name: str | None = None,
    artifact_retention_days: int | None | object = UNCHANGED,
) -> Department:
    """The slug is identity (storage prefixes, URLs); the display name and the
    retention of archived artifacts change, audited."""
    require_platform_admin(actor)
    with transaction.atomic():
        locked = Department.objects.select_for_update(no_key=True).get(pk=department.pk)
        changes: dict[str, list[object]] = {}
        if name is not None and name != locked.name:
            changes["name"] = [locked.name, name]
            locked.name = name
        if (
            artifact_retention_days is not UNCHANGED
            and artifact_retention_days != locked.artifact_retention_days
        ):
            changes["artifact_retention_days"] = [
                locked.artifact_retention_days,
                artifact_retention_days,
            ]
            # Not UNCHANGED (checked above), so the int or None the caller passed.
            locked.artifact_retention_days = cast("int | None", artifact_retention_days)
        if not changes:
            return locked
        locked.full_clean()
        locked.save(update_fields=list(changes))
        audit_record(
            actor=actor,
            action="department.updated",
            obj=locked,
            department=locked,
            details=changes,
        )
    return locked


def membership_set(*, actor: Actor, department: Department, username: str, role: str) -> Membership:
    """Adds a person to a department or changes their role."""
    require_platform_admin(actor)
    if role not in Role.values:
        raise ValidationFailed(f"Unknown role {role!r}; use one of {Role.values}.", code="bad_role")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise NotFound(f"No active user named {username!r}.")
    return membership_grant(actor=actor, user=user, department=department, role=role)


def membership_remove(*, actor: Actor, membership: Membership) -> None:
    require_platform_admin(actor)
    membership_revoke(actor=actor, membership=membership)


# The two below check no permission: their callers have decided who may. The
# functions above ask for a platform admin; single sign-on (sso/services.py)
# applies what the identity provider's signed claims say.


def membership_grant(
    *, actor: Actor, user, department: Department, role: str, details: dict | None = None
) -> Membership:
    """Gives `user` this role in the department (adding them if needed); audited."""
    with transaction.atomic():
        membership = (
            Membership.objects.select_for_update(no_key=True)
            .filter(user=user, department=department)
            .first()
        )
        previous = membership.role if membership else ""
        if membership is None:
            membership = Membership.objects.create(user=user, department=department, role=role)
        elif membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
        else:
            return membership
        audit_record(
            actor=actor,
            action="membership.changed" if previous else "membership.added",
            obj=membership,
            department=department,
            from_state=previous,
            to_state=role,
            details={"user": user.get_username(), **(details or {})},
        )
        membership_changed.send(
            sender=membership_grant, actor=actor, user=user, department=department
        )
    return membership


def membership_revoke(*, actor: Actor, membership: Membership, details: dict | None = None) -> None:
    with transaction.atomic():
        locked = Membership.objects.select_for_update(no_key=True).filter(pk=membership.pk).first()
        if locked is None:
            raise Conflict("This membership was already removed.")
        audit_record(
            actor=actor,
            action="membership.removed",
            obj=locked,
            department=locked.department,
            from_state=locked.role,
            details={"user": locked.user.get_username(), **(details or {})},
        )
        locked.delete()
        membership_changed.send(
            sender=membership_revoke, actor=actor, user=locked.user, department=locked.department
        )
