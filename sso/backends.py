"""mozilla-django-oidc's backend, made stricter and tied to the registry:

- people are matched on (issuer, sub), never on email (an email address can be
  re-assigned, or set by the user at some providers);
- the ID token's issuer, audience and expiry are checked (the library checks
  only the signature and the nonce), and every failure is a SuspiciousOperation
  with a message the callback page can show;
- the ID token's `sub` must be the userinfo's `sub` (OpenID Connect Core 5.3.2);
- memberships and platform admin follow the groups claim (sso/services.py).
"""

from __future__ import annotations

import jwt
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from sso.services import sso_sign_in

# Where the ID token's expiry is kept, for sso.views and sso.middleware.
TOKEN_EXPIRES_AT = "sso_token_expires_at"  # noqa: S105 - a session key


class OIDCBackend(OIDCAuthenticationBackend):
    def get_payload_data(self, token, key):
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise SuspiciousOperation("The identity provider sent a malformed token.") from None
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(
                f"The token is signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}."
            )
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.OIDC_ISSUER or None,
                leeway=settings.OIDC_CLOCK_SKEW_SECONDS,
                options={"require": ["exp", "iat", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise SuspiciousOperation("The ID token has expired.") from None
        except jwt.InvalidAudienceError:
            raise SuspiciousOperation("The ID token was issued for another client.") from None
        except jwt.InvalidIssuerError:
            raise SuspiciousOperation("The ID token comes from another issuer.") from None
        except jwt.InvalidSignatureError:
            raise SuspiciousOperation("The ID token's signature does not verify.") from None
        except jwt.InvalidTokenError as error:
            raise SuspiciousOperation(f"The ID token is not valid: {error}.") from None

    def verify_token(self, token, **kwargs):
        # The library's version, with a nonce message a person can act on.
        try:
            jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise SuspiciousOperation("The identity provider sent a malformed ID token.") from None
        if self.OIDC_RP_IDP_SIGN_KEY is not None:
            key = self.OIDC_RP_IDP_SIGN_KEY
        else:
            key = self.retrieve_matching_jwk(token)
        payload = self.get_payload_data(token, key)
        if "nonce" in kwargs and payload.get("nonce") != kwargs["nonce"]:
            raise SuspiciousOperation(
                "The ID token's nonce is not the one this sign-in sent (a replayed or "
                "injected token)."
            )
        return payload

    def verify_claims(self, claims):
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def get_token(self, payload):
        # The library passes on the ID and access tokens only; the refresh
        # token (scope offline_access) is what the periodic check asks with.
        token_info = super().get_token(payload)
        self._refresh_token = (
            token_info.get("refresh_token") if isinstance(token_info, dict) else None
        )
        return token_info

    def get_or_create_user(self, access_token, id_token, payload):
        try:
            return self._sign_in(access_token, id_token, payload)
        except SuspiciousOperation as error:
            # The library logs this and answers "no user"; keep the reason for the page.
            self.request.sso_refusal = str(error)
            raise

    def _sign_in(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("The userinfo answer is about another person.")
        claims = {**payload, **userinfo}
        if not self.verify_claims(claims):
            raise SuspiciousOperation("The identity provider sent no subject (sub).")
        result = sso_sign_in(
            request=self.request, issuer=settings.OIDC_ISSUER or payload["iss"], claims=claims
        )
        if result.user.is_active:
            from sso.checks import identity_keep_refresh_token

            identity_keep_refresh_token(
                identity=result.user.sso_identity,
                refresh_token=getattr(self, "_refresh_token", None),
            )
        self.request.session[TOKEN_EXPIRES_AT] = int(payload["exp"])
        self.request.sso_sign_in = result
        return result.user

    def get_user(self, user_id):
        # The library's get_user skips ModelBackend's is_active check.
        return ModelBackend.get_user(self, user_id)
