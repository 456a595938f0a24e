"""Page-wide context for the navigation: whether the viewer approves anywhere,
and how many versions wait for their review. Evaluated lazily, so pages and
partials that never show the navigation cost no queries."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from core.access import approver_department_ids
from core.actors import actor_from_request
from registry import selectors


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    def actor():
        if getattr(request, "actor", None) is None:
            request.actor = actor_from_request(request)
        return request.actor

    def is_approver() -> bool:
        approves_in = approver_department_ids(actor())
        return approves_in is None or bool(approves_in)

    def pending_count() -> int:
        return selectors.pending_reviews_for(actor()).count() if is_approver() else 0

    return {
        "is_approver": SimpleLazyObject(is_approver),
        "pending_count": SimpleLazyObject(pending_count),
    }
