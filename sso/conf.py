"""Settings of single sign-on, read from the environment (see
docs/operators/configuration.md). config/settings.py merges what `from_env()` returns.

SSO is on when a client id and either OIDC_ISSUER or the explicit endpoints are
set; half a configuration stops start-up naming what is missing.
"""

from __future__ import annotations

from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

from config import env as cfg
from sso.group_map import parse_group_map

# Needed without OIDC_ISSUER; the end-session endpoint is optional (no RP-initiated sign-out).
REQUIRED_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
LOGOUT_ENDPOINT = ("OIDC_OP_LOGOUT_ENDPOINT", "end_session_endpoint")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}

# Fixed: a call to the provider, and the clock difference an ID token may show.
OIDC_TIMEOUT = 10.0
OIDC_CLOCK_SKEW_SECONDS = 30

LOCAL_BACKEND = "django.contrib.auth.backends.ModelBackend"
OIDC_BACKEND = "sso.backends.OIDCBackend"


def _url(name: str, value: str) -> str:
    parsed = urlparse(value)
    # Tokens and the client secret travel to these URLs: plain http only on loopback.
    if parsed.scheme == "https" or (parsed.scheme == "http" and parsed.hostname in LOOPBACK):
        return value.rstrip("/") if name == "OIDC_ISSUER" else value
    raise ImproperlyConfigured(
        f"{name} must be an https:// URL (http:// only on loopback), got {value!r}"
    )


def from_env(*, client_secret_needed: bool = True) -> dict:
    """`client_secret_needed`: False in a process that neither signs people in nor
    runs the periodic check (config/roles.py), so it starts without the secret."""
    from sso.discovery import endpoint

    issuer = cfg.env.str("OIDC_ISSUER", default="").strip()
    client_id = cfg.env.str("OIDC_RP_CLIENT_ID", default="").strip()
    client_secret = (cfg.secret("OIDC_RP_CLIENT_SECRET") or "").strip()
    explicit = {
        name: cfg.env.str(name, default="").strip()
        for name in (*REQUIRED_ENDPOINTS, LOGOUT_ENDPOINT[0])
    }
    local_login = cfg.boolean("LOCAL_LOGIN", True)
    group_map = parse_group_map(cfg.env.str("OIDC_GROUP_MAP", default=""))
    enabled = bool(issuer or any(explicit.values()) or client_id)
    if enabled:
        if not client_id:
            raise ImproperlyConfigured("OIDC_RP_CLIENT_ID must be set to use single sign-on")
        if not client_secret and client_secret_needed:
            raise ImproperlyConfigured(
                "OIDC_RP_CLIENT_SECRET (or OIDC_RP_CLIENT_SECRET_FILE) must be set to use "
                "single sign-on"
            )
        if not issuer:
            missing = [name for name in REQUIRED_ENDPOINTS if not explicit[name]]
            if missing:
                raise ImproperlyConfigured(
                    f"Set OIDC_ISSUER, or all of {', '.join(missing)} for single sign-on"
                )
    if not local_login and not enabled:
        raise ImproperlyConfigured(
            "LOCAL_LOGIN=false needs single sign-on (OIDC_ISSUER and OIDC_RP_CLIENT_ID), "
            "or nobody could sign in"
        )

    endpoints = {}
    for name, key in (*REQUIRED_ENDPOINTS.items(), LOGOUT_ENDPOINT):
        if explicit[name]:
            endpoints[name] = _url(name, explicit[name])
        elif issuer and name != LOGOUT_ENDPOINT[0]:
            endpoints[name] = endpoint(key)
        else:
            endpoints[name] = ""

    ca_bundle = cfg.env.str("OIDC_CA_BUNDLE", default="").strip()
    backends = ([LOCAL_BACKEND] if local_login else []) + ([OIDC_BACKEND] if enabled else [])
    return {
        "SSO_ENABLED": enabled,
        "LOCAL_LOGIN": local_login,
        "AUTHENTICATION_BACKENDS": backends,
        "OIDC_ISSUER": _url("OIDC_ISSUER", issuer) if issuer else "",
        "OIDC_PROVIDER_NAME": cfg.env.str("OIDC_PROVIDER_NAME", default="single sign-on"),
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_RP_SCOPES": cfg.env.str("OIDC_RP_SCOPES", default="openid email profile"),
        "OIDC_RP_SIGN_ALGO": cfg.choice(
            "OIDC_RP_SIGN_ALGO", "RS256", {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}
        ),
        "OIDC_GROUPS_CLAIM": cfg.env.str("OIDC_GROUPS_CLAIM", default="groups"),
        "OIDC_USERNAME_CLAIM": cfg.env.str("OIDC_USERNAME_CLAIM", default="preferred_username"),
        # Matched (besides `sub`) against SCIM's externalId to link a first sign-in
        # to a provisioned account: a claim the person can never change.
        "OIDC_LINK_CLAIM": cfg.env.str("OIDC_LINK_CLAIM", default="sub").strip() or "sub",
        "OIDC_GROUP_MAP": group_map,
        # requests' `verify`: a CA bundle path, or a boolean.
        "OIDC_VERIFY_SSL": ca_bundle or cfg.boolean("OIDC_VERIFY_TLS", True),
        "OIDC_TIMEOUT": OIDC_TIMEOUT,
        "OIDC_CLOCK_SKEW_SECONDS": OIDC_CLOCK_SKEW_SECONDS,
        # The periodic check against the provider (sso/checks.py); 0 turns it off.
        "OIDC_CHECK_INTERVAL_SECONDS": cfg.integer("OIDC_CHECK_INTERVAL_SECONDS", 3600, minimum=0),
        **endpoints,
        # Fixed choices of how the library runs (not configurable on purpose).
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_USE_NONCE": True,
        "OIDC_STORE_ID_TOKEN": True,  # id_token_hint for RP-initiated sign-out
        "OIDC_CREATE_USER": True,
        "OIDC_EXEMPT_URLS": ["sso-no-access", "logout"],
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
        "OIDC_STATE_SIZE": 32,
        "OIDC_NONCE_SIZE": 32,
        "LOGIN_REDIRECT_URL_FAILURE": "/login/",
    }
