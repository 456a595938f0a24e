"""Sign-in pages: the login page (local and/or SSO), the OIDC redirect and
callback (mozilla-django-oidc's views, with pages that say what went wrong),
RP-initiated sign-out, and the page for people whose groups give no access."""

from __future__ import annotations

import logging
import time
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from mozilla_django_oidc import views as oidc_views

from core.forms import SignInForm
from sso import discovery
from sso.backends import TOKEN_EXPIRES_AT
from sso.conf import OIDC_BACKEND
from sso.models import Identity

log = logging.getLogger(__name__)


def _sso_context() -> dict:
    return {
        "sso_enabled": settings.SSO_ENABLED,
        "local_login": settings.LOCAL_LOGIN,
        "provider_name": settings.OIDC_PROVIDER_NAME,
    }


def _failed(request, message: str, status: int):
    return render(request, "sso/failed.html", {"message": message, **_sso_context()}, status=status)


class LoginView(auth_views.LoginView):
    authentication_form = SignInForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **_sso_context()}

    def post(self, request, *args, **kwargs):
        if not settings.LOCAL_LOGIN:
            return _failed(
                request,
                f"Password sign-in is turned off here; sign in with {settings.OIDC_PROVIDER_NAME}.",
                403,
            )
        return super().post(request, *args, **kwargs)


class AuthenticationRequestView(oidc_views.OIDCAuthenticationRequestView):
    """Redirects to the provider with state, nonce and a PKCE challenge (S256)."""

    def get(self, request):
        if not settings.SSO_ENABLED:
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except discovery.ProviderUnavailable as error:
            return _failed(request, str(error), 503)


class CallbackView(oidc_views.OIDCAuthenticationCallbackView):
    def get(self, request):
        if not settings.SSO_ENABLED:
            raise Http404("Single sign-on is not configured.")
        # RFC 9207: a provider that names itself in the redirect must be ours, or
        # the code came from another provider (a mix-up attack) and is never sent on.
        iss = request.GET.get("iss")
        if iss is not None and settings.OIDC_ISSUER and iss.rstrip("/") != settings.OIDC_ISSUER:
            return _failed(request, "Sign-in refused. The answer comes from another issuer.", 400)
        try:
            return super().get(request)
        except SuspiciousOperation as error:
            log.warning("sso: sign-in refused: %s", error)
            message = str(error)
            if "state not found" in message:
                message = (
                    "This sign-in's state does not match the one this browser started "
                    "(an old or forged link). Start again."
                )
            return _failed(request, f"Sign-in refused. {message}", 400)
        except discovery.ProviderUnavailable as error:
            return _failed(request, str(error), 503)
        except requests.RequestException as error:
            # The message may carry the provider's answer; the class is enough in the log.
            log.warning("sso: the identity provider failed the code exchange: %r", type(error))
            status = getattr(error.response, "status_code", None)
            return _failed(
                request,
                "The identity provider did not accept this sign-in "
                f"({'HTTP ' + str(status) if status else 'unreachable'}). Start again.",
                502,
            )

    def login_failure(self):
        refusal = getattr(self.request, "sso_refusal", None)
        if refusal:
            return _failed(self.request, f"Sign-in refused. {refusal}", 400)
        error = self.request.GET.get("error", "")[:100]
        if error:
            description = self.request.GET.get("error_description", "")[:300]
            message = f"The identity provider said: {error}. {description}".strip()
        elif "oidc_states" not in self.request.session:
            message = "This sign-in was not started in this browser, or it expired. Start again."
        else:
            message = "This account is disabled here."
        return _failed(self.request, message, 401)

    def login_success(self):
        response = super().login_success()
        session = self.request.session
        # The session lasts as long as the provider's ID token: then sso.middleware
        # asks the provider again (silently), which re-reads the groups.
        session["oidc_id_token_expiration"] = session.get(TOKEN_EXPIRES_AT, time.time())
        result = getattr(self.request, "sso_sign_in", None)
        if result is not None and not result.has_access:
            return HttpResponseRedirect(reverse("sso-no-access"))
        return response


def provider_logout_url(request) -> str | None:
    """The provider's end-session URL for this session, or None (local sign-out)."""
    if request.session.get(BACKEND_SESSION_KEY) != OIDC_BACKEND:
        return None
    endpoint = settings.OIDC_OP_LOGOUT_ENDPOINT
    if not endpoint and settings.OIDC_ISSUER:
        try:
            endpoint = discovery.metadata().get("end_session_endpoint") or ""
        except discovery.ProviderUnavailable:
            endpoint = ""  # sign out here at least
    if not endpoint:
        return None
    params = {
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(
            resolve_url(settings.LOGOUT_REDIRECT_URL)
        ),
    }
    if request.session.get("oidc_id_token"):
        params["id_token_hint"] = request.session["oidc_id_token"]
    return f"{endpoint}?{urlencode(params)}"


@require_POST
def logout(request):
    """POST only, like Django's LogoutView: a link or an <img> cannot sign anyone out.
    An SSO session also ends at the provider (RP-initiated logout)."""
    target = provider_logout_url(request) or resolve_url(settings.LOGOUT_REDIRECT_URL)
    auth.logout(request)
    return HttpResponseRedirect(target)


@require_GET
@login_required
def no_access(request):
    identity = Identity.objects.filter(user=request.user).first()
    groups = identity.groups if identity else []
    return render(
        request,
        "sso/no_access.html",
        {
            "groups": groups,
            "unmapped": settings.OIDC_GROUP_MAP.unmapped(groups),
            "has_access": request.user.is_staff or request.user.memberships.exists(),
            **_sso_context(),
        },
    )
