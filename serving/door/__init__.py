"""The front door: one client URL that sends each request to the replicas that
hold its model.

`routing` computes, from the database, what the front door should do (a pure
function and its selector); a `FrontDoor` does it. HAProxy (`haproxy.py`) is
the one implementation today; another door (vllm-router, LiteLLM, the
Gateway API Inference Extension) implements the same small protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from serving.door.callers import DoorAccess
from serving.door.routing import RoutingTable


@dataclass(frozen=True)
class TakenOut:
    """What `take_out` did: its changes; whether the door holds the model's new
    requests (the replica was the only one serving it), under which owner; and
    the requests still in flight on the replica when the wait gave up (0: none)."""

    changes: list[str]
    held: bool = False
    owner: str = ""
    busy: int = 0


class FrontDoor(Protocol):
    """What the control plane asks of a door. Every method returns the
    runtime changes it made, as human-readable commands, for the record."""

    def apply(self, table: RoutingTable) -> list[str]:
        """Makes the routes match the table without dropping a request. Routes
        the table marks `held` (a rollout owns them now) keep their states."""

    def apply_access(self, access: DoorAccess) -> list[str]:
        """Makes the door enforce `access` (keys, grants, each caller's model
        list, open or not), in effect for the next request."""

    def drain(self, model: str, server: str, *, timeout: float, keep_one: bool = True) -> list[str]:
        """Sends no new request for `model` to `server`, then waits until the
        requests it has in flight are done (at most `timeout` seconds). With
        `keep_one`, the last replica that serves `model` is left serving."""

    def ready(self, model: str, server: str) -> list[str]:
        """Sends `model`'s requests to `server` again."""

    def take_out(
        self,
        model: str,
        server: str,
        *,
        timeout: float,
        hold_seconds: float,
        owner: str,
        tick: Callable[[], None] | None = None,
    ) -> TakenOut:
        """Before a swap of `model` on `server`: no new request of it goes
        there, and its requests in flight there finish (waited at most
        `timeout`). Where another replica serves `model`, a drain. Where none
        does, the door holds `model`'s new requests (at most `hold_seconds`
        each) until `release`, so that no client meets the swap's gap. `tick()`
        runs while it waits."""

    def release(self, model: str, *, owner: str) -> list[str]:
        """Ends `owner`'s hold of `model`: the held requests go on, routed as
        the door routes now. Another owner's hold is left alone."""

    def weigh(self, model: str, weights: dict[str, int]) -> list[str]:
        """Sets `model`'s weight on these servers (a canary's split; 0 sends
        it nothing new). In effect for the next request."""

    def samples(self, model: str) -> tuple[str, dict]:
        """A read: per server of `model`, its cumulative requests, errors and
        mean response time (ServerSample), and the epoch that counted them
        (counters restart when it changes)."""

    def model_counters(self) -> dict:
        """A read, not a change: per adapter, the requests and the 4xx and 5xx
        answered so far (they restart at zero when the door reloads)."""
