from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from core.csrf import csrf_subject
from core.services.tokens import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer lrt_...` for pipelines. request.auth is the ApiToken."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword:
            # Credentials the API does not understand are refused, not ignored:
            # falling through to the session cookie would answer 200 to a
            # request whose own credentials are invalid (schemathesis' ignored_auth).
            raise exceptions.AuthenticationFailed(
                f"Unsupported Authorization scheme {scheme[:20]!r}; send 'Bearer <token>'."
            )
        secret = secret.strip()
        if not secret:
            raise exceptions.AuthenticationFailed("The Bearer token is empty.")
        token = token_authenticate(secret)
        if token is None:
            # One message for unknown, expired and revoked: no oracle for guessing.
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.acting_user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class SessionAuthentication(authentication.SessionAuthentication):
    """DRF's session authentication, with its CSRF check taking a token in the
    X-CSRFToken header without parsing the body, so a session upload can stream
    (core.csrf). Without the header it checks the form field, as DRF does."""

    def enforce_csrf(self, request):
        super().enforce_csrf(csrf_subject(request))


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A department API token.",
        }


class SessionScheme(OpenApiAuthenticationExtension):
    # drf-spectacular knows DRF's own class only; without this the schema listed
    # the bearer token alone, as if a signed-in session could not call the API.
    target_class = SessionAuthentication
    name = "cookieAuth"

    def get_security_definition(self, auto_schema):
        from django.conf import settings

        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME}
