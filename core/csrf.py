"""CSRF for views that stream the request body.

Django's CSRF check looks for the token in request.POST first and only then in
the X-CSRFToken header, and reading request.POST parses the whole multipart
body: a streamed upload would be spooled to disk before the view ran. When the
header is there, the check is shown the request with an empty POST, so it
takes the header and the body stays unread. Everything else is Django's own
check unchanged (cookie secret, masked token comparison, Origin and Referer);
without the header (a form posted without JavaScript) it reads the body, as
before, but only for someone signed in: an anonymous caller is sent to the
sign-in page before one byte of a body that may be gigabytes is read.

A form posted without the header must carry an Origin header, which every
current browser sends with a POST: Django checks Origin before it looks for the
token, so a cross-site form is refused with its body unread, and only a
same-origin form's body is parsed to find the token. A post with neither
(no browser sends that) is refused before the body as well.
"""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import QueryDict
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

REASON_NO_ORIGIN = (
    "A form post without the X-CSRFToken header must carry an Origin header "
    "(browsers send one): the body is not read without either."
)


class _BodyUnread:
    """The request as the CSRF check sees it: the same in every respect but POST."""

    def __init__(self, request):
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "POST", QueryDict())

    def __getattr__(self, name):
        return getattr(self._request, name)

    def __setattr__(self, name, value):
        # What the check records (csrf_processing_done, the cookie to set) lands on the request.
        setattr(self._request, name, value)


def csrf_subject(request):
    """What a CSRF check should read: with a token in the header, the request
    with its body hidden; otherwise the request itself."""
    if settings.CSRF_HEADER_NAME in request.META:
        return _BodyUnread(request)
    return request


def csrf_before_body(view):
    """Checks CSRF, from the header when it is there, before the view reads the
    body; a refusal is Django's 403. The middleware is told to leave the view alone."""

    checker = CsrfViewMiddleware(lambda request: None)

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            response = redirect_to_login(request.get_full_path())
            response["Connection"] = "close"  # the unread body is still on the socket
            return response
        if settings.CSRF_HEADER_NAME not in request.META and "HTTP_ORIGIN" not in request.META:
            # Django's own refusal (the 403 page, logged on django.security.csrf).
            response = checker._reject(request, REASON_NO_ORIGIN)
            response["Connection"] = "close"
            return response
        refused = checker.process_view(csrf_subject(request), None, (), {})
        if refused is not None:
            return refused
        return view(request, *args, **kwargs)

    return csrf_exempt(wrapper)
