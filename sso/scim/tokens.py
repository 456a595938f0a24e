"""The identity provider's SCIM credential: shown once, stored as a SHA-256
digest, expiring, revocable, audited. A prefix of its own (`lrs_`), a table of
its own: the API's token check (core.services.tokens) never looks here, and
the SCIM check never looks at API tokens or sessions."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, ValidationFailed
from core.services.tokens import hash_token_secret, token_lifetime_days
from sso.models import ScimToken

SCIM_TOKEN_PREFIX = "lrs_"  # noqa: S105 - a public marker, not a secret


@dataclass(frozen=True)
class ScimActor(Actor):
    """The provider acting through a SCIM token. Audited as the token, with the
    platform admin who minted it as the user; never a platform admin itself."""

    scim_token: ScimToken | None = None

    @property
    def is_platform_admin(self) -> bool:
        return False

    @property
    def label(self) -> str:
        prefix = self.scim_token.prefix if self.scim_token else "?"
        return f"scim:{prefix} (created by {self.user.get_username()})"


def scim_token_create(*, actor: Actor, name: str, expires_in_days: int | None = None):
    """A platform admin mints the provider's token. Returns (row, secret)."""
    require_platform_admin(actor)
    name = name.strip()
    if not name:
        raise ValidationFailed("A SCIM token needs a name.", code="bad_name")
    days = token_lifetime_days(expires_in_days, settings.SCIM_TOKEN_DEFAULT_DAYS)
    secret = SCIM_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ScimToken.objects.create(
            name=name[:100],
            prefix=secret[: len(SCIM_TOKEN_PREFIX) + 8],
            secret_sha256=hash_token_secret(secret),
            created_by=actor.user,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit_record(
            actor=actor,
            action="scim_token.created",
            obj=token,
            department=None,
            details={"expires_at": token.expires_at.isoformat()},
        )
    return token, secret


def scim_token_revoke(*, actor: Actor, token: ScimToken) -> ScimToken:
    require_platform_admin(actor)
    with transaction.atomic():
        locked = ScimToken.objects.select_for_update(no_key=True).get(pk=token.pk)
        if locked.revoked_at is not None:
            raise Conflict("This SCIM token is already revoked.", code="already_revoked")
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="scim_token.revoked", obj=locked, department=None)
    return locked


def scim_token_authenticate(secret: str) -> ScimToken | None:
    """The live token for this secret, or None (unknown, expired, revoked). It
    does not end with the admin who minted it: it is the provider's, and
    provisioning (deactivations first) must not stop when that admin leaves."""
    if not secret.startswith(SCIM_TOKEN_PREFIX):
        return None
    token = (
        ScimToken.objects.select_related("created_by")
        .filter(secret_sha256=hash_token_secret(secret))
        .first()
    )
    now = timezone.now()
    if token is None or token.revoked_at is not None or token.expires_at <= now:
        return None
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ScimToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
