"""Doors that pull their state: the control plane's side (docs/door.md#doors-that-pull).

A deployment named `pull` in SERVING_DOORS has any number of doors, each
HAProxy with an agent beside it (serving/door/agent.py). No worker reaches
into a door. A FrontDoor call here writes the deployment's desired door state
(serving/door/state.py) as a new generation, compare-and-swap on the
generation, then waits until every live door has acknowledged it:

- a door is live while the control plane has heard from it within its lease
  (`DoorInstance.seen_at`); a door stops routing by itself when its lease
  runs out (the agent renews it in HAProxy after each exchange that
  succeeded, from the moment it sent it);
- a step that needs the doors (a drain before an unload, ready after a
  verify, a hold, a canary's weights) returns once each door of the
  deployment has either acknowledged the generation or stopped being live.

Reads (`samples`, `model_counters`) add up what the live doors last reported.
Nothing here holds a database transaction across a wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from serving.door import TakenOut
from serving.door.callers import DoorAccess
from serving.door.haproxy import DoorError
from serving.door.haproxy.runtime import BackendCounters
from serving.door.routing import Route, RoutingTable, ServerState
from serving.door.selectors import door_access, routing_table_for
from serving.door.state import DoorDocument, Hold, decode, encode
from serving.models import Deployment, DoorInstance, DoorState
from serving.rules.canary_gates import ServerSample

logger = logging.getLogger(__name__)

PULL = "pull"
# Clocks of the doors and the control plane may differ by this much: a door is
# taken for gone this long after its own lease would have run out.
CLOCK_MARGIN_SECONDS = 1.0
WAIT_STEP_SECONDS = 0.02
CAS_ATTEMPTS = 100


def _document_from_database(deployment: Deployment) -> DoorDocument:
    table = routing_table_for(deployment)
    return DoorDocument(
        table=_unheld(table, keep=None),
        access=door_access(deployment),
        lease_seconds=settings.SERVING_DOOR_LEASE_SECONDS,
        drain_seconds=settings.SERVING_DOOR_DRAIN_SECONDS,
    )


def _unheld(table: RoutingTable, keep: RoutingTable | None) -> RoutingTable:
    """`table` as a door applies it: a route a rollout holds keeps the states
    and weights it has in `keep` (the rollout moves them itself)."""
    routes = {}
    for model, route in table.routes.items():
        kept = keep.routes.get(model) if keep is not None and route.held else None
        if kept is not None:
            states = {s: kept.states.get(s, state) for s, state in route.states.items()}
            route = replace(route, states=states, weights=dict(kept.weights))
        routes[model] = replace(route, held=False)
    return replace(table, routes=routes)


def current_document(deployment: Deployment) -> tuple[int, DoorDocument | None]:
    row = DoorState.objects.filter(deployment=deployment).values("generation", "document").first()
    if row is None or not row["document"]:
        return 0, None
    return row["generation"], decode(row["document"])


def change(deployment: Deployment, mutate: Callable[[DoorDocument], DoorDocument]) -> int:
    """Writes `mutate(current)` as the next generation (compare-and-swap on the
    generation; retried when another writer won); the generation that holds
    the change (the current one when nothing changed)."""
    DoorState.objects.get_or_create(deployment=deployment)
    for _ in range(CAS_ATTEMPTS):
        row = DoorState.objects.values("pk", "generation", "document").get(deployment=deployment)
        current = decode(row["document"]) if row["document"] else None
        if current is None:
            current = _document_from_database(deployment)
        new = encode(mutate(current))
        if new == row["document"]:
            return row["generation"]
        with transaction.atomic():
            won = DoorState.objects.filter(pk=row["pk"], generation=row["generation"]).update(
                document=new, generation=row["generation"] + 1, changed_at=timezone.now()
            )
        if won:
            return row["generation"] + 1
    raise DoorError(f"door state of {deployment.name}: {CAS_ATTEMPTS} writers in a row won first")


def live_doors(deployment: Deployment) -> list[DoorInstance]:
    now = timezone.now()
    return [
        door
        for door in DoorInstance.objects.filter(deployment=deployment)
        if now - door.seen_at < timedelta(seconds=door.lease_seconds + CLOCK_MARGIN_SECONDS)
    ]


def await_doors(
    deployment: Deployment,
    generation: int,
    *,
    timeout: float,
    tick: Callable[[], None] | None = None,
) -> tuple[list[str], int]:
    """Waits until every door of the deployment has acknowledged `generation`
    or is no longer live (at most `timeout`); notes for the record, and the
    requests the doors still had in flight on what they drained."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        live = live_doors(deployment)
        waiting = [door.name for door in live if door.applied_generation < generation]
        if not waiting:
            busy = sum(door.busy for door in live)
            notes = [f"{len(live)} door(s) applied generation {generation}"]
            if busy:
                notes.append(f"{busy} request(s) still in flight at the doors")
            return notes, busy
        if time.monotonic() > deadline:
            names = ", ".join(sorted(waiting))
            return [f"door(s) {names} had not applied generation {generation} in time"], 0
        time.sleep(WAIT_STEP_SECONDS)


def heard_from(deployment: Deployment, name: str) -> DoorInstance:
    """A door asked for its state: it is live from now for its lease (the
    moment it sent the request, from which it renews its lease, came first)."""
    door, created = DoorInstance.objects.get_or_create(
        deployment=deployment,
        name=name,
        defaults={"seen_at": timezone.now(), "lease_seconds": settings.SERVING_DOOR_LEASE_SECONDS},
    )
    if not created:
        DoorInstance.objects.filter(pk=door.pk).update(
            seen_at=timezone.now(), lease_seconds=settings.SERVING_DOOR_LEASE_SECONDS
        )
    return door


def acknowledge(
    deployment: Deployment,
    name: str,
    *,
    generation: int,
    busy: int,
    report: dict,
    peer_address: str = "",
) -> None:
    """A door's report: it applied `generation`, still has `busy` requests in
    flight on what it drained, counted `report` (what `samples` reads), and
    talks HAProxy's peers protocol at `peer_address` (empty: it does not
    find its peers here)."""
    door = heard_from(deployment, name)
    # Never backwards: a late report of an older generation keeps the newer one.
    DoorInstance.objects.filter(pk=door.pk, applied_generation__lt=generation).update(
        applied_generation=generation
    )
    DoorInstance.objects.filter(pk=door.pk).update(
        busy=busy, report=report, peer_address=peer_address
    )


def door_peers(deployment: Deployment) -> list[tuple[str, str]]:
    """The live doors of `deployment` that find their peers through the
    control plane, by name, with their peers addresses: what each of them
    lists in its `peers` section, so that a caller's requests per minute are
    counted across the doors that run now (docs/door.md#peers). A door that
    stops is dropped once its lease has run out."""
    return sorted(
        (door.name, door.peer_address) for door in live_doors(deployment) if door.peer_address
    )


def _servers_of(document: DoorDocument, model: str) -> dict[str, ServerState]:
    route = document.table.routes.get(model)
    return dict(route.states) if route is not None else {}


def _with_state(document: DoorDocument, model: str, server: str, state: ServerState):
    route = document.table.routes.get(model)
    if route is None or server not in route.states:
        return document
    routes = dict(document.table.routes)
    routes[model] = replace(route, states={**route.states, server: state})
    return replace(document, table=replace(document.table, routes=routes))


class PulledFrontDoor:
    """The FrontDoor of a deployment whose doors pull their state."""

    def __init__(self, deployment: Deployment):
        self.deployment = deployment

    def _publish(self, mutate, *, timeout: float, tick=None) -> tuple[list[str], int]:
        generation = change(self.deployment, mutate)
        notes, busy = await_doors(
            self.deployment,
            generation,
            timeout=timeout + settings.SERVING_DOOR_LEASE_SECONDS + CLOCK_MARGIN_SECONDS,
            tick=tick,
        )
        return [f"generation {generation}", *notes], busy

    def apply(self, table: RoutingTable) -> list[str]:
        def mutate(document: DoorDocument) -> DoorDocument:
            return replace(
                document,
                table=_unheld(table, keep=document.table),
                lease_seconds=settings.SERVING_DOOR_LEASE_SECONDS,
                drain_seconds=settings.SERVING_DOOR_DRAIN_SECONDS,
            )

        before, _ = current_document(self.deployment)
        generation = change(self.deployment, mutate)
        # A sync does not wait for the doors: they follow within their poll.
        return [f"door state generation {generation}"] if generation != before else []

    def apply_access(self, access: DoorAccess) -> list[str]:
        before, _ = current_document(self.deployment)
        generation = change(self.deployment, lambda document: replace(document, access=access))
        return [f"door access generation {generation}"] if generation != before else []

    def drain(self, model: str, server: str, *, timeout: float, keep_one: bool = True) -> list[str]:
        _, document = current_document(self.deployment)
        states = _servers_of(document, model) if document else {}
        if server not in states:
            return []
        others = [s for s, state in states.items() if s != server and state == ServerState.READY]
        if keep_one and not others and states[server] == ServerState.READY:
            return [f"kept {server} ready for {model}: no other replica serves it"]
        notes, _ = self._publish(
            lambda d: _with_state(d, model, server, ServerState.DRAIN), timeout=timeout
        )
        return [f"drain {model} on {server}", *notes]

    def ready(self, model: str, server: str) -> list[str]:
        _, document = current_document(self.deployment)
        if document is None or server not in _servers_of(document, model):
            return []  # a first load: the next sync adds the route
        notes, _ = self._publish(
            lambda d: _with_state(d, model, server, ServerState.READY), timeout=0
        )
        return [f"ready {model} on {server}", *notes]

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
        if not owner.isalnum():
            raise ValueError(f"a hold's owner is letters and digits, not {owner!r}")
        _, document = current_document(self.deployment)
        states = _servers_of(document, model) if document else {}
        others = [s for s, state in states.items() if s != server and state == ServerState.READY]
        alone = states.get(server) == ServerState.READY and not others
        if not alone or hold_seconds <= 0:
            return TakenOut(self.drain(model, server, timeout=timeout, keep_one=True))

        def held(document: DoorDocument) -> DoorDocument:
            until = int((time.time() + hold_seconds) * 1000)
            holds = {**document.holds, model: Hold(owner=owner, until_ms=until)}
            return _with_state(replace(document, holds=holds), model, server, ServerState.DRAIN)

        try:
            notes, busy = self._publish(held, timeout=timeout, tick=tick)
            # The wait took some of the hold: renewed for the swap itself.
            renewed, _ = self._publish(held, timeout=0, tick=tick)
        except Exception:
            self.release(model, owner=owner)
            raise
        return TakenOut([f"hold {model}, drain {server}", *notes, *renewed], True, owner, busy)

    def release(self, model: str, *, owner: str) -> list[str]:
        def released(document: DoorDocument) -> DoorDocument:
            hold = document.holds.get(model)
            if hold is None or hold.owner != owner:
                return document
            return replace(document, holds={m: h for m, h in document.holds.items() if m != model})

        notes, _ = self._publish(released, timeout=0)
        return [f"release {model}", *notes]

    def weigh(self, model: str, weights: dict[str, int]) -> list[str]:
        def weighed(document: DoorDocument) -> DoorDocument:
            route: Route | None = document.table.routes.get(model)
            if route is None:
                return document
            known = {s: w for s, w in weights.items() if s in route.states}
            routes = {**document.table.routes, model: replace(route, weights=known)}
            return replace(document, table=replace(document.table, routes=routes))

        notes, _ = self._publish(weighed, timeout=0)
        return [f"weigh {model} {sorted(weights.items())}", *notes]

    def samples(self, model: str) -> tuple[str, dict[str, ServerSample]]:
        """Each server's counters for `model`, added up over the live doors;
        the epoch names every door's own (a door that reloads or a door that
        comes or goes starts a new count)."""
        epochs: list[str] = []
        totals: dict[str, ServerSample] = {}
        for door in sorted(live_doors(self.deployment), key=lambda d: d.name):
            report = door.report or {}
            epochs.append(f"{door.name}:{report.get('epoch', '')}")
            for server, (requests, errors, latency) in (
                report.get("samples", {}).get(model, {}).items()
            ):
                seen = totals.get(server)
                if seen is None:
                    totals[server] = ServerSample(requests, errors, float(latency))
                else:
                    weight = seen.requests + requests
                    mean = (
                        (seen.latency_ms * seen.requests + latency * requests) / weight
                        if weight
                        else 0.0
                    )
                    totals[server] = ServerSample(
                        seen.requests + requests, seen.errors + errors, mean
                    )
        return ",".join(epochs), totals

    def model_counters(self) -> dict[str, BackendCounters]:
        totals: dict[str, BackendCounters] = {}
        for door in live_doors(self.deployment):
            for model, (requests, e4, e5) in (door.report or {}).get("counters", {}).items():
                seen = totals.get(model, BackendCounters(0, 0, 0))
                totals[model] = BackendCounters(
                    seen.requests + requests, seen.errors_4xx + e4, seen.errors_5xx + e5
                )
        return totals
