"""The base every server-rendered page stands on.

Views take the viewer's Actor and call one service; the rules live in the
services and core.access. A NotFound becomes the 404 page, so outsiders learn
nothing about a department's objects.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.utils.http import url_has_allowed_host_and_scheme

from core.actors import actor_from_request
from core.errors import ApplicationError, NotFound
from core.redaction import redact


def page(view):
    """Login required; the view gets the viewer's Actor (also kept on
    request.actor for template tags); a NotFound becomes the 404 page."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        request.actor = actor_from_request(request)
        try:
            return view(request, request.actor, *args, **kwargs)
        except NotFound as error:
            raise Http404(error.message) from None

    return wrapper


class FormOutcome:
    """What `errors_on(form)` saw: `failed` and the HTTP status to answer with."""

    def __init__(self) -> None:
        self.failed = False
        self.status = 200


@contextmanager
def errors_on(form, field_codes: dict[str, str] | None = None):
    """Runs a service call; an ApplicationError becomes a form error and the
    response status (a NotFound still becomes the 404 page: the page's object may
    be out of the person's reach).

    `field_codes` maps error codes to the form field they are about: a name typed
    into that field that names nobody (a NotFound of that code) is the field's
    error, shown on the form with a 400, not a 404 page.

        with errors_on(form, {"owner_not_found": "owners"}) as outcome:
            adapter = adapter_create(...)
        if not outcome.failed: ...
    """
    outcome = FormOutcome()
    try:
        yield outcome
    except NotFound as error:
        field = (field_codes or {}).get(error.code)
        if field is None:
            raise
        form.add_error(field, error.message)
        outcome.failed, outcome.status = True, 400
    except ApplicationError as error:
        form.add_error(None, error.message if error.public else redact(error.message))
        outcome.failed, outcome.status = True, error.status


def paginate(request, queryset, per_page: int):
    return Paginator(queryset, per_page).get_page(request.GET.get("page"))


def safe_next(request, fallback: str) -> str:
    """The POSTed `next` if it stays on this site, else the fallback (no open redirect)."""
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return fallback
