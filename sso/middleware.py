"""Ends an SSO session when the provider's ID token expires.

A page load (GET of HTML) after expiry goes back to the provider with
prompt=none (mozilla-django-oidc's SessionRefresh): if the person still has a
session there, they come straight back with fresh tokens and freshly synced
roles; if not, the callback says so and they sign in again. Anything else
(a form post, an htmx or API call) cannot follow a redirect to the provider,
so the session is simply ended and the request goes on unauthenticated.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import BACKEND_SESSION_KEY
from django.http import HttpResponse
from django.utils.deprecation import MiddlewareMixin
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc import middleware as oidc_middleware

from sso.conf import OIDC_BACKEND


class SessionRefresh(oidc_middleware.SessionRefresh):
    def __init__(self, get_response):
        # The library reads its settings once, when the middleware is built; these
        # are read per request (__getattr__), so SSO can be off at start-up and on
        # in a test, and OIDC_OP_AUTHORIZATION_ENDPOINT is resolved only when used.
        MiddlewareMixin.__init__(self, get_response)

    def __getattr__(self, name):
        if name.startswith("OIDC_"):
            return getattr(settings, name)
        raise AttributeError(name)

    def process_request(self, request):
        if not settings.SSO_ENABLED or not request.user.is_authenticated:
            return None
        if request.session.get(BACKEND_SESSION_KEY) != OIDC_BACKEND:
            return None  # a local sign-in
        if request.path in self.exempt_urls:
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        navigation = request.method == "GET" and "text/html" in request.headers.get("Accept", "")
        if request.headers.get("HX-Request"):
            # Reload the page the person is on; that load takes the branch below.
            current = request.headers.get("HX-Current-URL", "")
            safe = url_has_allowed_host_and_scheme(current, {request.get_host()})
            return HttpResponse(status=200, headers={"HX-Redirect": current if safe else "/"})
        if not navigation:
            auth.logout(request)
            return None
        return super().process_request(request)
