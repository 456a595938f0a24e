"""Pipeline tokens: shown once, stored as a SHA-256 digest, scoped to one
department and a list of abilities, expiring, revocable.

A plain SHA-256 is enough here (unlike for passwords) because the secret is
256 random bits: there is nothing to brute-force."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.access import can_approve, require_visible
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import Ability, ApiToken, Department

TOKEN_PREFIX = "lrt_"  # noqa: S105 - a public marker, not a secret


def hash_token_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_lifetime_days(requested: int | None, default: int) -> int:
    """The days a new token lives: `requested` or `default`, within API_TOKEN_MAX_DAYS
    (API tokens and SCIM tokens alike)."""
    days = requested or default
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise ValidationFailed(
            f"expires_in_days must be between 1 and {settings.API_TOKEN_MAX_DAYS}.",
            code="bad_expiry",
        )
    return days


def token_create(
    *,
    actor: Actor,
    department: Department,
    name: str,
    abilities: list[str],
    expires_in_days: int | None = None,
) -> tuple[ApiToken, str]:
    """A person's token: it acts as them, and ends when they leave the
    department or are deactivated. Returns the row and its secret; the secret
    is never stored or shown again."""
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot create tokens; sign in as a person.", code="token_forbidden"
        )
    require_visible(actor, department.pk, "Department")
    return token_mint(
        actor=actor,
        department=department,
        name=name,
        abilities=abilities,
        expires_in_days=expires_in_days,
    )


def token_mint(
    *,
    actor: Actor,
    department: Department,
    name: str,
    abilities: list[str],
    expires_in_days: int | None = None,
    service_account=None,
) -> tuple[ApiToken, str]:
    """Checks abilities, name and expiry and writes the token; the caller has
    decided who may (token_create, service_account_token_create)."""
    unknown = sorted(set(abilities) - set(Ability.values))
    if unknown:
        raise ValidationFailed(
            f"Unknown abilities: {', '.join(unknown)}. Allowed: {', '.join(Ability.values)}.",
            code="bad_ability",
        )
    if not abilities:
        raise ValidationFailed("Name at least one ability.", code="bad_ability")
    if not name.strip():
        raise ValidationFailed("A token needs a name.", code="bad_name")
    days = token_lifetime_days(expires_in_days, settings.API_TOKEN_DEFAULT_DAYS)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            department=department,
            service_account=service_account,
            name=name.strip()[:100],
            prefix=secret[: len(TOKEN_PREFIX) + 8],
            secret_sha256=hash_token_secret(secret),
            abilities=sorted(set(abilities)),
            created_by=actor.user,
            expires_at=timezone.now() + timedelta(days=days),
        )
        details = {"abilities": token.abilities, "expires_at": token.expires_at.isoformat()}
        if service_account is not None:
            details["service_account"] = str(service_account)
        audit_record(
            actor=actor, action="token.created", obj=token, department=department, details=details
        )
    return token, secret


def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot revoke tokens; sign in as a person.", code="token_forbidden"
        )
    own = token.created_by_id == actor.user.pk
    # A service account's tokens are its department's: any approver may end one.
    departments = token.service_account_id is not None and can_approve(actor, token.department_id)
    if not (actor.is_platform_admin or own or departments):
        raise NotFound("Token not found.")
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update(no_key=True).get(pk=token.pk)
        if locked.revoked_at is not None:
            raise Conflict("This token is already revoked.", code="already_revoked")
        locked.revoked_at = timezone.now()
        locked.revoked_by = actor.user
        locked.save(update_fields=["revoked_at", "revoked_by"])
        audit_record(
            actor=actor,
            action="token.revoked",
            obj=locked,
            department=locked.department,
        )
    return locked


def token_authenticate(secret: str) -> ApiToken | None:
    """The active token for this secret, or None. Expired and revoked tokens are
    refused; so are a person's tokens once they are deactivated or have left the
    department, and a service account's once the account is deactivated (its
    creator leaving does not matter: the department owns it)."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    token = (
        ApiToken.objects.select_related(
            "created_by", "department", "service_account__user", "service_account__created_by"
        )
        .filter(secret_sha256=hash_token_secret(secret))
        .first()
    )
    now = timezone.now()
    if token is None or token.revoked_at is not None or token.expires_at <= now:
        return None
    account = token.service_account
    if account is not None:
        if not account.active or account.department_id != token.department_id:
            return None
        if not account.user.is_active:
            return None
    else:
        creator = token.created_by
        if not creator.is_active:
            return None
        if (
            not creator.is_staff
            and not creator.memberships.filter(department=token.department).exists()
        ):
            return None
    # Written at most once a minute so that busy pipelines don't turn reads into writes.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
