"""Ends a signed-in session that has been idle for SESSION_IDLE_TIMEOUT_SECONDS.

Django's own sliding expiry (SESSION_SAVE_EVERY_REQUEST) writes the session on
every request; this writes the last-seen time at most once a minute, so a busy
page costs one session write a minute, and the idle limit is exact to a minute.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import logout

LAST_SEEN = "last_seen"
WRITE_EVERY_SECONDS = 60


def session_started(sender, request, user, **kwargs) -> None:
    # Stamped at sign-in, so the first pages after it write nothing more.
    if hasattr(request, "session"):
        request.session[LAST_SEEN] = int(time.time())


class IdleSessionTimeout:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            now = int(time.time())
            last_seen = request.session.get(LAST_SEEN)
            if last_seen is not None and now - last_seen > settings.SESSION_IDLE_TIMEOUT_SECONDS:
                # It goes on as anonymous: a page redirects to sign-in, the API says 401/403.
                logout(request)
            elif last_seen is None or now - last_seen >= WRITE_EVERY_SECONDS:
                request.session[LAST_SEEN] = now
        return self.get_response(request)
