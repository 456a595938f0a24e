"""What every API view of the product stands on."""

from __future__ import annotations

from core.actors import Actor, actor_from_request
from core.errors import NotFound


def schema_only(view) -> bool:
    """True while drf-spectacular builds the schema: there is no request, so no
    actor, and a view's queryset is only asked for its model."""
    return getattr(view, "swagger_fake_view", False)


class ActorMixin:
    @property
    def actor(self) -> Actor:
        if not hasattr(self, "_actor"):
            self._actor = actor_from_request(self.request)
        return self._actor

    def lookup_id(self) -> int:
        """The numeric id in the URL; anything else names no object (404, not 500)."""
        raw = self.kwargs["pk"]
        # Digits only, and within a database integer: a larger one overflowed into a 500.
        if not (str(raw).isascii() and str(raw).isdigit()) or int(raw) > 2**63 - 1:
            raise NotFound(f"No object with id {raw!r}.")
        return int(raw)
