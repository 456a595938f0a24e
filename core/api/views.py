"""What every API view of the product stands on."""

from __future__ import annotations

from core.actors import Actor, actor_from_request
from core.errors import NotFound


class ActorMixin:
    @property
    def actor(self) -> Actor:
        if not hasattr(self, "_actor"):
            self._actor = actor_from_request(self.request)
        return self._actor

    def lookup_id(self) -> int:
        """The numeric id in the URL; anything else names no object (404, not 500)."""
        raw = self.kwargs["pk"]
        if not str(raw).isdigit():
            raise NotFound(f"No object with id {raw!r}.")
        return int(raw)
