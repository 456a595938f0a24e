"""What the identity provider's SCIM calls change, audited (`via: scim`).

Users: created, replaced, deactivated (`active: false`) and deleted through
core.services.people, so a deactivation ends the person's sessions and revokes
their API tokens in the same transaction. Users are never deleted here either:
a DELETE deactivates, takes the person out of every SCIM group, and hides them
from SCIM (`ScimUser.deleted_at`).

Groups: their display names are read through OIDC_GROUP_MAP exactly like a
groups claim at sign-in (sso.services.roles_sync), and every member whose
groups changed is synced at once: losing a group removes the membership it
gave, and with it every access that membership gave (sessions and tokens are
checked against memberships on each request).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict
from core.services.people import user_saved, user_update
from sso.models import ScimGroup, ScimUser
from sso.services import roles_sync, scim_group_names


@dataclass
class UserData:
    user_name: str
    given_name: str = ""
    family_name: str = ""
    email: str = ""
    active: bool = True
    external_id: str = ""
    email_type: str = ""
    email_primary: bool = True


@dataclass
class GroupData:
    display_name: str
    external_id: str = ""
    members: list[str] | None = None  # SCIM ids; None leaves the members as they are


def _new_id() -> str:
    return str(uuid.uuid4())


def _fields(data: UserData) -> dict:
    return {
        "username": data.user_name,
        "first_name": data.given_name,
        "last_name": data.family_name,
        "email": data.email,
        "is_active": data.active,
    }


def _scim_fields(data: UserData) -> dict:
    return {
        "external_id": data.external_id,
        "email_type": data.email_type if data.email else "",
        "email_primary": data.email_primary,
    }


def scim_user_create(*, actor: Actor, data: UserData) -> ScimUser:
    """A new person, or the adoption of an account of the same userName that the
    provider already made (by a sign-in through SSO, or SCIM before a DELETE).
    A local account or a service account of that name is a 409: the provider
    does not get to take over an account it did not make."""
    users = get_user_model()
    with transaction.atomic():
        existing = (
            users.objects.select_for_update(no_key=True)
            .filter(username__iexact=data.user_name)
            .first()
        )
        if existing is None:
            user = users(**_fields(data))
            user.set_unusable_password()  # this person signs in at the provider only
            user.save()
            user_saved(actor=actor, user=user, before=None, via="scim")
            return ScimUser.objects.create(user=user, scim_id=_new_id(), **_scim_fields(data))
        scim_user = ScimUser.objects.filter(user=existing).first()
        adoptable = (scim_user is not None and scim_user.deleted_at is not None) or (
            scim_user is None and hasattr(existing, "sso_identity")
        )
        if not adoptable:
            raise Conflict(f"A user named {data.user_name!r} already exists.", code="uniqueness")
        user_update(actor=actor, user=existing, via="scim", **_fields(data))
        if scim_user is None:
            scim_user = ScimUser(user=existing)
        # A new SCIM resource: a new id, so the old one stays 404 as RFC 7644 says.
        scim_user.scim_id = _new_id()
        for name, value in _scim_fields(data).items():
            setattr(scim_user, name, value)
        scim_user.deleted_at = None
        scim_user.save()
        audit_record(
            actor=actor,
            action="user.scim_adopted",
            obj=existing,
            department=None,
            details={"via": "scim", "scim_id": scim_user.scim_id},
        )
        _sync(actor, [scim_user])
        return scim_user


def scim_user_replace(*, actor: Actor, scim_user: ScimUser, data: UserData) -> ScimUser:
    """PUT, and PATCH after its operations are applied to the current values. A
    deactivation ends sessions and tokens at once (core.services.people)."""
    users = get_user_model()
    with transaction.atomic():
        clash = (
            users.objects.filter(username__iexact=data.user_name)
            .exclude(pk=scim_user.user_id)
            .exists()
        )
        if clash:
            raise Conflict(f"A user named {data.user_name!r} already exists.", code="uniqueness")
        was_active = scim_user.user.is_active
        user_update(actor=actor, user=scim_user.user, via="scim", **_fields(data))
        fields = _scim_fields(data)
        changed = {
            name: [getattr(scim_user, name), value]
            for name, value in fields.items()
            if getattr(scim_user, name) != value
        }
        if changed:
            ScimUser.objects.filter(pk=scim_user.pk).update(**fields)
            for name, value in fields.items():
                setattr(scim_user, name, value)
            audit_record(
                actor=actor,
                action="user.scim_changed",
                obj=scim_user.user,
                department=None,
                details={"via": "scim", "changes": changed},
            )
        if data.active and not was_active:
            _sync(actor, [scim_user])  # back: the groups they are in count again
    return scim_user


def scim_user_delete(*, actor: Actor, scim_user: ScimUser) -> None:
    with transaction.atomic():
        locked = ScimUser.objects.select_for_update(no_key=True).get(pk=scim_user.pk)
        if locked.deleted_at is not None:
            return
        user_update(actor=actor, user=locked.user, via="scim", is_active=False)
        groups = list(locked.groups.values_list("display_name", flat=True))
        locked.groups.clear()
        locked.deleted_at = timezone.now()
        locked.save(update_fields=["deleted_at"])
        audit_record(
            actor=actor,
            action="user.scim_deleted",
            obj=locked.user,
            department=None,
            details={"via": "scim", "scim_id": locked.scim_id, "groups_left": sorted(groups)},
        )
        _sync(actor, [locked])


def _members(ids: list[str]) -> list[ScimUser]:
    found = {
        u.scim_id: u
        for u in ScimUser.objects.select_related("user").filter(
            scim_id__in=set(ids), deleted_at__isnull=True
        )
    }
    missing = sorted(set(ids) - set(found))
    if missing:
        from core.errors import ValidationFailed

        raise ValidationFailed(
            f"No SCIM user with id {', '.join(missing[:5])}"
            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            + ".",
            code="invalidValue",
        )
    return list(found.values())


def scim_group_create(*, actor: Actor, data: GroupData) -> ScimGroup:
    with transaction.atomic():
        if ScimGroup.objects.filter(display_name=data.display_name).exists():
            raise Conflict(
                f"A group named {data.display_name!r} already exists.", code="uniqueness"
            )
        group = ScimGroup.objects.create(
            scim_id=_new_id(), display_name=data.display_name, external_id=data.external_id
        )
        members = _members(data.members or [])
        group.members.set(members)
        audit_record(
            actor=actor,
            action="scim_group.created",
            obj=group,
            department=None,
            details={"via": "scim", "members": sorted(m.user.username for m in members)},
        )
        _sync(actor, members)
    return group


def scim_group_change(
    *,
    actor: Actor,
    group: ScimGroup,
    display_name: str | None = None,
    external_id: str | None = None,
    set_members: list[str] | None = None,
    add_members: Sequence[str] = (),
    remove_members: Sequence[str] = (),
) -> ScimGroup:
    """PUT and PATCH of a group: a rename or a change of members re-syncs
    everyone who was or is in it."""
    with transaction.atomic():
        locked = ScimGroup.objects.select_for_update(no_key=True).get(pk=group.pk)
        before = set(locked.members.values_list("scim_id", flat=True))
        details: dict = {"via": "scim"}
        if display_name is not None and display_name != locked.display_name:
            taken = ScimGroup.objects.filter(display_name=display_name).exclude(pk=locked.pk)
            if taken.exists():
                raise Conflict(f"A group named {display_name!r} already exists.", code="uniqueness")
            details["display_name"] = [locked.display_name, display_name]
            locked.display_name = display_name
        if external_id is not None and external_id != locked.external_id:
            details["external_id"] = [locked.external_id, external_id]
            locked.external_id = external_id
        locked.save()
        after = set(before) if set_members is None else set(set_members)
        after |= set(add_members)
        after -= set(remove_members)
        members = _members(sorted(after))
        if after != before:
            locked.members.set(members)
            details["added"] = sorted(after - before)
            details["removed"] = sorted(before - after)
        if len(details) > 1:
            audit_record(
                actor=actor,
                action="scim_group.changed",
                obj=locked,
                department=None,
                details=details,
            )
        affected = before | after if "display_name" in details else before ^ after
        _sync(actor, ScimUser.objects.filter(scim_id__in=affected).select_related("user"))
    return locked


def scim_group_delete(*, actor: Actor, group: ScimGroup) -> None:
    with transaction.atomic():
        locked = ScimGroup.objects.select_for_update(no_key=True).get(pk=group.pk)
        members = list(locked.members.select_related("user"))
        audit_record(
            actor=actor,
            action="scim_group.deleted",
            obj=locked,
            department=None,
            details={"via": "scim", "members": sorted(m.user.username for m in members)},
        )
        locked.delete()
        _sync(actor, members)


def _sync(actor: Actor, scim_users) -> None:
    """Each person's roles from the SCIM groups they are in now."""
    for scim_user in scim_users:
        user = scim_user.user
        groups = [] if scim_user.deleted_at else scim_group_names(user)
        roles_sync(actor=actor, user=user, groups=groups, via="scim")
