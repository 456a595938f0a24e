"""The periodic check of SSO people against the identity provider, for
providers that do not push SCIM (sso/scim/).

OpenID Connect has no "does this person still exist?" call. What a provider
does say: a refresh token it issued (scope offline_access) is refused with
`invalid_grant` once the person is disabled or deleted there, or their grant
is revoked. So each sign-in keeps the refresh token (encrypted), and every
OIDC_CHECK_INTERVAL_SECONDS the check redeems it:

- refused with `invalid_grant`: the person is deactivated through the audited
  people service (`via: sso-check`), which ends their sessions and revokes
  their API tokens at once;
- accepted: the new refresh token is kept (providers rotate them), and when the
  provider's userinfo answer carries the groups claim, roles are synced from it
  as at a sign-in, so a lost group is noticed without a sign-in;
- anything else (the provider down, our client refused, a timeout) changes
  nothing but the recorded result: a provider outage must not deactivate
  everyone.

People provisioned through SCIM are skipped (the provider pushes their
changes), and so are people with no refresh token (the provider issued none:
they are checked only when they sign in). docs/security.md says what this can
and cannot see.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from datetime import timedelta

import requests
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.actors import system_actor
from core.audit import audit_record
from core.services.people import user_update
from sso.models import Identity

log = logging.getLogger(__name__)
GONE = "gone"
ACTIVE = "active"


def _fernet() -> Fernet:
    # A key of its own, derived from SECRET_KEY: rotating SECRET_KEY makes the
    # stored tokens unreadable, and the check then treats them as absent.
    digest = hashlib.sha256(b"sso-refresh-token:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(refresh_token: str) -> str:
    return _fernet().encrypt(refresh_token.encode()).decode()


def unseal(sealed: str) -> str | None:
    try:
        return _fernet().decrypt(sealed.encode()).decode()
    except (InvalidToken, ValueError):
        return None


def identity_keep_refresh_token(*, identity: Identity, refresh_token: str | None) -> None:
    """At sign-in: the provider's refresh token, if it issued one."""
    if not isinstance(refresh_token, str) or not refresh_token or len(refresh_token) > 8192:
        return
    Identity.objects.filter(pk=identity.pk).update(refresh_token_encrypted=seal(refresh_token))


def due_identities(limit: int):
    """Identities to check now: active, not SCIM-managed, with a refresh token,
    not checked within the interval."""
    before = timezone.now() - timedelta(seconds=settings.OIDC_CHECK_INTERVAL_SECONDS)
    return (
        Identity.objects.filter(user__is_active=True, user__scim_user__isnull=True)
        .exclude(refresh_token_encrypted="")
        .filter(Q(checked_at__isnull=True) | Q(checked_at__lt=before))
        .order_by("checked_at", "pk")
        .values_list("pk", "checked_at")[:limit]
    )


def _claim(pk: int, seen) -> bool:
    """Compare-and-swap on checked_at: 0 rows means another worker has it."""
    return bool(
        Identity.objects.filter(pk=pk, checked_at=seen).update(checked_at=timezone.now())
        if seen is not None
        else Identity.objects.filter(pk=pk, checked_at__isnull=True).update(
            checked_at=timezone.now()
        )
    )


def sso_check_due(limit: int = 200) -> dict:
    """One pass: claims and checks up to `limit` due identities. Returns counts."""
    counts: dict[str, int] = {}
    for pk, seen in list(due_identities(limit)):
        if not _claim(pk, seen):
            continue
        result = identity_check(Identity.objects.select_related("user").get(pk=pk))
        key = result.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


def _record(identity: Identity, result: str) -> str:
    Identity.objects.filter(pk=identity.pk).update(
        check_result=result[:200], checked_at=timezone.now()
    )
    return result


def identity_check(identity: Identity) -> str:
    """Asks the provider about one person (no lock held across the calls)."""
    refresh_token = unseal(identity.refresh_token_encrypted)
    if refresh_token is None:
        Identity.objects.filter(pk=identity.pk).update(refresh_token_encrypted="")
        return _record(identity, "error: stored refresh token unreadable (SECRET_KEY changed?)")
    try:
        response = requests.post(
            str(settings.OIDC_OP_TOKEN_ENDPOINT),
            data={
                "grant_type": "refresh_token",
                "refresh_token": refresh_token,
                "client_id": settings.OIDC_RP_CLIENT_ID,
                "client_secret": settings.OIDC_RP_CLIENT_SECRET,
            },
            verify=settings.OIDC_VERIFY_SSL,
            timeout=settings.OIDC_TIMEOUT,
            allow_redirects=False,
        )
    except Exception as error:  # requests' errors, and the discovery's ProviderUnavailable
        log.warning("sso check of %s: token endpoint unreachable: %s", identity.user, error)
        return _record(identity, f"error: token endpoint unreachable ({type(error).__name__})")
    log.info("sso check of %s: token endpoint answered %s", identity.user, response.status_code)
    error_code = _error_code(response)
    if response.status_code == 400 and error_code == "invalid_grant":
        _deactivate(identity, "the provider refused the refresh token (invalid_grant)")
        return _record(identity, GONE)
    if response.status_code != 200:
        return _record(identity, f"error: token endpoint {response.status_code} {error_code}")
    try:
        tokens = response.json()
    except ValueError:
        return _record(identity, "error: token endpoint answered no JSON")
    identity_keep_refresh_token(identity=identity, refresh_token=tokens.get("refresh_token"))
    _sync_from_userinfo(identity, tokens.get("access_token"))
    return _record(identity, ACTIVE)


def _error_code(response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    code = body.get("error") if isinstance(body, dict) else None
    return code[:50] if isinstance(code, str) else ""


def _deactivate(identity: Identity, reason: str) -> None:
    user = identity.user
    with transaction.atomic():
        audit_record(
            actor=None,
            action="user.gone_at_provider",
            obj=user,
            department=None,
            details={"via": "sso-check", "reason": reason, "subject": identity.subject},
        )
        # Ends every session and revokes the person's tokens (core.services.people).
        user_update(actor=None, user=user, via="sso-check", is_active=False)
        Identity.objects.filter(pk=identity.pk).update(refresh_token_encrypted="")


def _sync_from_userinfo(identity: Identity, access_token) -> None:
    if not isinstance(access_token, str) or not access_token:
        return
    try:
        response = requests.get(
            str(settings.OIDC_OP_USER_ENDPOINT),
            headers={"Authorization": f"Bearer {access_token}"},
            verify=settings.OIDC_VERIFY_SSL,
            timeout=settings.OIDC_TIMEOUT,
            allow_redirects=False,
        )
        claims = response.json() if response.status_code == 200 else None
    except Exception as error:
        log.warning("sso check of %s: userinfo failed: %s", identity.user, error)
        return
    if not isinstance(claims, dict) or claims.get("sub") != identity.subject:
        return
    if settings.OIDC_GROUPS_CLAIM not in claims:
        return  # this provider puts groups in the ID token only: nothing to compare
    from sso.services import groups_from_claims, roles_sync

    roles_sync(
        actor=system_actor(identity.user),
        user=identity.user,
        groups=groups_from_claims(claims),
        via="sso-check",
    )
