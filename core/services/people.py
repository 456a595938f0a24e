"""Changes to people and groups, audited: who may sign in (is_active), who is a
platform admin (is_staff, is_superuser), their password, email and groups.

The Django admin's User and Group screens call these (core/admin.py), and so
does single sign-on for email changes (sso/services.py). Deactivating a person
ends their sessions and their own API tokens at once: access follows the
company, not the next sign-in. Service accounts' tokens are the department's
and stay, listed for review, unless OFFBOARDING_REVOKE_SERVICE_TOKENS ends
the ones the person minted.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from core.actors import Actor
from core.audit import audit_record
from core.models import ApiToken
from core.service_account_selectors import describe_minted, tokens_minted_by
from core.services.service_accounts import minted_tokens_end
from core.signals import user_access_ended

AUDITED_FIELDS = (
    "username",
    "email",
    "first_name",
    "last_name",
    "is_active",
    "is_staff",
    "is_superuser",
)


def _snapshot(user) -> dict:
    return {name: getattr(user, name) for name in AUDITED_FIELDS}


def user_changes(before: dict, user) -> dict:
    after = _snapshot(user)
    return {
        name: [before[name], after[name]] for name in AUDITED_FIELDS if before[name] != after[name]
    }


def user_saved(
    *, actor: Actor | None, user, before: dict | None, via: str, extra: dict | None = None
):
    """Records a user row the caller has just saved (inside the same
    transaction); `before` is `user_snapshot()` from before the change, None
    for a new user. A deactivation ends sessions and tokens here too."""
    if before is None:
        audit_record(
            actor=actor,
            action="user.created",
            obj=user,
            department=None,
            details={"via": via, **_snapshot(user), **(extra or {})},
        )
        return
    changes = user_changes(before, user)
    if not changes and not extra:
        return
    audit_record(
        actor=actor,
        action="user.changed",
        obj=user,
        department=None,
        details={"via": via, "changes": changes, **(extra or {})},
    )
    if "is_active" in changes and not user.is_active:
        user_access_end(actor=actor, user=user, reason="deactivated")


def user_snapshot(user) -> dict | None:
    """The audited fields as the database has them now (None for a new row)."""
    if user.pk is None:
        return None
    stored = get_user_model().objects.filter(pk=user.pk).first()
    return _snapshot(stored) if stored is not None else None


def user_update(*, actor: Actor | None, user, via: str, **values):
    """Sets audited fields on `user` and records the change."""
    unknown = set(values) - set(AUDITED_FIELDS)
    if unknown:
        raise ValueError(f"not an audited user field: {sorted(unknown)}")
    with transaction.atomic():
        locked = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
        before = _snapshot(locked)
        for name, value in values.items():
            setattr(locked, name, value)
        locked.save(update_fields=list(values) or None)
        user_saved(actor=actor, user=locked, before=before, via=via)
    for name, value in values.items():
        setattr(user, name, value)
    return locked


def user_password_changed(*, actor: Actor | None, user, via: str) -> None:
    audit_record(
        actor=actor, action="user.password_changed", obj=user, department=None, details={"via": via}
    )


def user_groups_changed(*, actor: Actor | None, user, before: set[str], after: set[str], via: str):
    if before == after:
        return
    audit_record(
        actor=actor,
        action="user.groups_changed",
        obj=user,
        department=None,
        details={"via": via, "added": sorted(after - before), "removed": sorted(before - after)},
    )


def user_access_end(*, actor: Actor | None, user, reason: str) -> dict:
    """Ends every session of `user` and revokes every token they created for
    themselves, at once; audited. Returns what was ended.

    The service-account tokens they minted are their departments' and keep
    working, unless OFFBOARDING_REVOKE_SERVICE_TOKENS says to end them too: the
    event lists them either way, and the admin's people screen offers to end
    the ones kept (core.admin.PersonAdmin)."""
    now = timezone.now()
    by = actor.user if actor else None
    with transaction.atomic():
        tokens = ApiToken.objects.filter(
            created_by=user, service_account__isnull=True, revoked_at__isnull=True
        )
        revoked = list(tokens.values_list("prefix", flat=True))
        tokens.update(revoked_at=now, revoked_by=by)
        sessions = _sessions_of(user)
        Session.objects.filter(session_key__in=sessions).delete()
        ended = {"reason": reason, "revoked_tokens": revoked, "sessions_ended": len(sessions)}
        if settings.OFFBOARDING_REVOKE_SERVICE_TOKENS:
            ended["revoked_service_account_tokens"] = minted_tokens_end(by=by, user=user)
        else:
            ended["service_account_tokens_kept"] = describe_minted(tokens_minted_by(user))
        # Other apps end what the person holds there (serving: inference keys),
        # before the audit record below takes the audit chain: rows first.
        user_access_ended.send(sender=user_access_end, actor=actor, user=user, reason=reason)
        audit_record(
            actor=actor, action="user.access_ended", obj=user, department=None, details=ended
        )
    return ended


def _sessions_of(user) -> list[str]:
    # The database session backend keeps the user id inside the encoded data
    # only; a scan of live sessions is the price of ending them at once.
    keys = []
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if str(session.get_decoded().get("_auth_user_id")) == str(user.pk):
            keys.append(session.session_key)
    return keys


def group_saved(*, actor: Actor | None, group, before: dict | None, via: str) -> None:
    after = {
        "name": group.name,
        "permissions": sorted(group.permissions.values_list("codename", flat=True)),
    }
    if before == after:
        return
    audit_record(
        actor=actor,
        action="group.created" if before is None else "group.changed",
        obj=group,
        department=None,
        details={"via": via, "before": before, "after": after},
    )


def group_snapshot(group) -> dict | None:
    """The group as the database has it now (None for a new row)."""
    from django.contrib.auth.models import Group

    stored = Group.objects.filter(pk=group.pk).first() if group.pk else None
    if stored is None:
        return None
    return {
        "name": stored.name,
        "permissions": sorted(stored.permissions.values_list("codename", flat=True)),
    }
