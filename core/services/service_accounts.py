"""Service accounts: pipelines that are not people.

A department owns each one; its approvers (or a platform admin) create it and
mint its tokens. The tokens carry abilities and an expiry like a person's, but
they act as the account: they keep working when the person who created them
leaves, and stop when the account is deactivated. A service account can never
approve (it acts only through tokens, and tokens never approve), and every
event it causes names the account and who created it (core.audit).
"""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.access import can_approve, require_platform_admin, require_visible
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotAuthorized, ValidationFailed
from core.models import ApiToken, Department, ServiceAccount
from core.service_account_selectors import describe_minted, tokens_minted_by
from core.services.tokens import token_mint
from core.signals import service_account_deactivated

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _require_department_approver(actor: Actor, department_id: int) -> None:
    require_visible(actor, department_id, "Department")
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot manage service accounts; sign in as a person.", code="token_forbidden"
        )
    if not can_approve(actor, department_id):
        raise NotAuthorized(
            "Only an approver of this department or a platform admin manages its service accounts.",
            code="not_an_approver",
        )


def service_account_username(department: Department, name: str) -> str:
    # A dot never appears in a department slug or an account name: no clash with people.
    return f"svc.{department.slug}.{name}"


def service_account_create(
    *, actor: Actor, department: Department, name: str, description: str = ""
) -> ServiceAccount:
    _require_department_approver(actor, department.pk)
    name = name.strip()
    if not _NAME.match(name):
        raise ValidationFailed(
            "A service account's name is lower-case letters, digits and dashes (at most 63).",
            code="bad_name",
        )
    users = get_user_model()
    try:
        with transaction.atomic():
            user = users(username=service_account_username(department, name), is_active=True)
            user.set_unusable_password()  # it never signs in; it acts through tokens only
            user.save()
            account = ServiceAccount.objects.create(
                department=department,
                name=name,
                description=description.strip()[:300],
                user=user,
                created_by=actor.user,
            )
            audit_record(
                actor=actor, action="service_account.created", obj=account, department=department
            )
    except IntegrityError:
        raise Conflict(
            f"{department.slug} already has a service account named {name!r}.",
            code="duplicate_name",
        ) from None
    return account


def service_account_token_create(
    *,
    actor: Actor,
    account: ServiceAccount,
    name: str,
    abilities: list[str],
    expires_in_days: int | None = None,
) -> tuple[ApiToken, str]:
    _require_department_approver(actor, account.department_id)
    with transaction.atomic():
        # The account's row first, as its deactivation locks it: a mint and a
        # deactivation of one account go one after the other, never both (and
        # in the order of every audited write: rows, then the audit chain).
        locked = service_account_lock_active(account)
        return token_mint(
            actor=actor,
            department=locked.department,
            name=name,
            abilities=abilities,
            expires_in_days=expires_in_days,
            service_account=locked,
        )


def service_account_lock(account: ServiceAccount) -> ServiceAccount:
    """The account's row, locked for this transaction (FOR NO KEY UPDATE: rows
    that only refer to it are not held up)."""
    return ServiceAccount.objects.select_for_update(no_key=True).get(pk=account.pk)


def service_account_lock_active(account: ServiceAccount) -> ServiceAccount:
    """The account locked, for adding what it holds (a token, a key): a 409 if
    it is deactivated, and a deactivation waits until this transaction ends."""
    locked = service_account_lock(account)
    if not locked.active:
        raise Conflict("This service account is deactivated.", code="service_account_inactive")
    return locked


def service_account_deactivate(*, actor: Actor, account: ServiceAccount) -> ServiceAccount:
    """Ends the account and every token it has, at once; audited."""
    _require_department_approver(actor, account.department_id)
    now = timezone.now()
    with transaction.atomic():
        locked = service_account_lock(account)
        if locked.deactivated_at is not None:
            raise Conflict("This service account is already deactivated.", code="already_inactive")
        locked.deactivated_at, locked.deactivated_by = now, actor.user
        locked.save(update_fields=["deactivated_at", "deactivated_by"])
        revoked = list(
            locked.tokens.filter(revoked_at__isnull=True).values_list("prefix", flat=True)
        )
        locked.tokens.filter(revoked_at__isnull=True).update(revoked_at=now, revoked_by=actor.user)
        # Other apps end what the account holds (serving: its inference keys)
        # before the audit record below takes the audit chain: rows first.
        service_account_deactivated.send(
            sender=service_account_deactivate, actor=actor, account=locked
        )
        audit_record(
            actor=actor,
            action="service_account.deactivated",
            obj=locked,
            department=locked.department,
            details={"revoked_tokens": revoked},
        )
    return locked


def minted_tokens_end(*, by, user) -> list[dict]:
    """Revokes the working service-account tokens `user` minted, in the caller's
    transaction and audit event (offboarding: core.services.people); returns
    what was ended. `by`: the person ending them, or None (the system)."""
    tokens = list(tokens_minted_by(user))
    ApiToken.objects.filter(pk__in=[t.pk for t in tokens], revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=by
    )
    return describe_minted(tokens)


def minted_tokens_revoke(*, actor: Actor, user) -> list[dict]:
    """What offboarding offers a platform admin: end the pipeline tokens a leaver
    minted (they outlive the person, as service-account tokens do); audited."""
    require_platform_admin(actor)
    with transaction.atomic():
        ended = minted_tokens_end(by=actor.user, user=user)
        if ended:
            audit_record(
                actor=actor,
                action="user.minted_tokens_revoked",
                obj=user,
                department=None,
                details={"revoked_service_account_tokens": ended},
            )
    return ended
