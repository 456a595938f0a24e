"""What the control plane does to a deployment's front door: sync its routes
with the routing table, and drain / put back one replica for one adapter
around a swap. Every runtime change that concerns a replica is recorded as an
HttpAttempt of that replica (purpose "gateway"); the others (map entries,
reloads) are logged.

Nothing here holds a database transaction across a call to the door.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from serving.door import FrontDoor, TakenOut
from serving.door.callers import DoorAccess
from serving.door.fleet import PULL, PulledFrontDoor
from serving.door.haproxy import DoorError, HAProxyFrontDoor, Peer
from serving.door.routing import RoutingTable, server_name
from serving.door.selectors import door_access, routing_table_for
from serving.models import Deployment, HttpAttempt, Replica

logger = logging.getLogger(__name__)


def front_door_for(deployment: Deployment) -> FrontDoor | None:
    """The deployment's front door, or None where it has none (SERVING_DOORS).
    Where the deployment's doors are peers (SERVING_DOOR_PEERS), this process
    drives the one named SERVING_DOOR_PEER_NAME: a name not among them stops it,
    for it would count requests in a table no other door reads."""
    listen = settings.SERVING_DOORS.get(deployment.name)
    if not listen:
        return None
    if listen == PULL:
        return PulledFrontDoor(deployment)
    doors = settings.SERVING_DOOR_PEERS.get(deployment.name, ())
    peers = tuple(Peer(name, address) for name, address in doors)
    try:
        return HAProxyFrontDoor(
            settings.SERVING_DOOR_DIR / deployment.name,
            listen=listen,
            max_body_bytes=settings.SERVING_DOOR_MAX_BODY_BYTES,
            metrics=settings.SERVING_DOOR_METRICS.get(deployment.name, ""),
            hold_seconds=settings.SERVING_DOOR_HOLD_SECONDS,
            key_concurrency=settings.SERVING_DOOR_KEY_CONCURRENCY,
            source_connections=settings.SERVING_DOOR_CONNECTIONS_PER_SOURCE,
            certificate=settings.SERVING_DOOR_CERTIFICATES.get(deployment.name, ""),
            peers=peers,
            peer_name=settings.SERVING_DOOR_PEER_NAME,
        )
    except ValueError as error:
        raise ImproperlyConfigured(
            f"SERVING_DOOR_PEERS / SERVING_DOOR_PEER_NAME for {deployment.name}: {error}"
        ) from None


def door_sync(deployment: Deployment, *, release: str | None = None) -> list[str]:
    """Makes the deployment's front door route as the database says. `release`
    names an adapter whose claim the caller holds and is done with: its route
    is synced too (a rollout's last step). A gateway that fails is logged; the
    next reconcile tries again."""
    door = front_door_for(deployment)
    if door is None:
        return []
    table = routing_table_for(deployment)
    if release is not None and release in table.routes:
        table = _unheld(table, release)
    started = time.monotonic()
    try:
        changes = door.apply(table)
    except DoorError as error:
        logger.warning("front door of %s: %s", deployment.name, error)
        _record(deployment, [], started, error=str(error))
        return []
    _record(deployment, changes, started)
    # Who may call what follows too: a change the access sync missed (a broker
    # down) is caught up here, at one runtime read when nothing changed.
    return changes + door_sync_access(deployment)


def door_sync_access(deployment: Deployment, access: DoorAccess | None = None) -> list[str]:
    """Makes the deployment's front door enforce who may call what
    (`door_access`, or `access` where the caller has it): keys, grants, each
    caller's `/v1/models`, open or not; through the runtime API, no reload. A
    door that fails is logged; the next sync pushes the whole table again."""
    door = front_door_for(deployment)
    if door is None:
        return []
    if access is None:
        access = door_access(deployment)
    try:
        changes = door.apply_access(access)
    except DoorError as error:
        logger.warning("front door of %s: access: %s", deployment.name, error)
        return []
    for change in changes:
        logger.info("front door of %s: %s", deployment.name, change)
    return changes


def door_drain(
    deployment: Deployment, name: str, replicas: list[Replica], *, keep_one: bool = True
) -> list[str]:
    """No new request for `name` to these replicas; returns once their requests
    in flight are done (at most SERVING_DOOR_DRAIN_SECONDS each). With
    `keep_one` (a swap: make before break), a replica that is the only one
    serving `name` is left serving and swapped in place."""
    door = front_door_for(deployment)
    if door is None:
        return []
    timeout = settings.SERVING_DOOR_DRAIN_SECONDS
    return _each(
        deployment,
        replicas,
        lambda server: door.drain(name, server, timeout=timeout, keep_one=keep_one),
    )


def door_drain_each(
    deployment: Deployment,
    pairs: list[tuple[str, Replica]],
    *,
    keep_one: bool = True,
    tick=None,
    interval: float = 1.0,
) -> list[list[str]]:
    """door_drain of each (adapter name, replica) pair at once, the waits in
    pool threads that touch no database while `tick()` runs in this one every
    `interval` seconds (a caller's claim outlives drains of up to
    SERVING_DOOR_DRAIN_SECONDS); recorded here after. Returns each pair's
    changes, in order; a front door that fails gives that pair none."""
    door = front_door_for(deployment)
    if door is None or not pairs:
        return [[] for _ in pairs]
    timeout = settings.SERVING_DOOR_DRAIN_SECONDS

    def drain(pair) -> tuple[list[str], str, float]:
        name, replica = pair
        started = time.monotonic()
        try:
            changes = door.drain(name, server_name(replica.pk), timeout=timeout, keep_one=keep_one)
        except DoorError as error:
            return [], str(error), started
        return changes, "", started

    from serving.fanout import fan_out

    results = fan_out(pairs, drain, limit=16, tick=tick, interval=interval)
    for (_, replica), (changes, error, started) in zip(pairs, results, strict=True):
        if error:
            logger.warning("front door of %s: %s", deployment.name, error)
            _record(deployment, [f"{server_name(replica.pk)}/ failed"], started, error=error)
        else:
            _record(deployment, changes, started)
    return [changes for changes, _, _ in results]


def door_take_out(
    deployment: Deployment, name: str, replica: Replica, *, owner: str, tick=None
) -> TakenOut | None:
    """Before a swap of `name` on `replica`: drained at the door where another
    replica serves `name`; where none does, `name`'s new requests held at the
    door (SERVING_DOOR_HOLD_SECONDS at most each) and the replica drained
    once its requests in flight are done (SERVING_DOOR_DRAIN_SECONDS at
    most; `tick()` runs meanwhile). Recorded as the replica's. None without a
    door, or when it failed (logged and recorded; the swap goes on in place,
    as without a hold)."""
    door = front_door_for(deployment)
    if door is None:
        return None
    started = time.monotonic()
    try:
        taken = door.take_out(
            name,
            server_name(replica.pk),
            timeout=settings.SERVING_DOOR_DRAIN_SECONDS,
            hold_seconds=settings.SERVING_DOOR_HOLD_SECONDS,
            owner=owner,
            tick=tick,
        )
    except DoorError as error:
        logger.warning("front door of %s: %s", deployment.name, error)
        _record(deployment, [], started, error=str(error), replica=replica)
        return None
    _record(deployment, taken.changes, started, replica=replica)
    return taken


def door_release(deployment: Deployment, name: str, replica: Replica, *, owner: str) -> None:
    """Ends `owner`'s hold of `name` (the swap on `replica` is done, or undone):
    the held requests go on. A door that fails is logged and recorded; the
    hold's deadline ends it, and the next sync removes it."""
    door = front_door_for(deployment)
    if door is None:
        return
    started = time.monotonic()
    try:
        changes = door.release(name, owner=owner)
    except DoorError as error:
        logger.warning("front door of %s: %s", deployment.name, error)
        _record(deployment, [], started, error=str(error), replica=replica)
        return
    _record(deployment, changes, started, replica=replica)


def door_ready(deployment: Deployment, name: str, replicas: list[Replica]) -> list[str]:
    door = front_door_for(deployment)
    if door is None:
        return []
    return _each(deployment, replicas, lambda server: door.ready(name, server))


def door_weigh(deployment: Deployment, name: str, weights: dict[int, int]) -> list[str]:
    """Sets `name`'s weight on these replicas ({replica id: weight}): a canary's
    split, its end, or (weight 0) the traffic switch of its rollback. Recorded;
    a door that fails raises DoorError, for the canary decides what then."""
    door = front_door_for(deployment)
    if door is None:
        return []
    started = time.monotonic()
    try:
        changes = door.weigh(name, {server_name(pk): w for pk, w in weights.items()})
    except DoorError as error:
        _record(deployment, [], started, error=str(error))
        raise
    _record(deployment, changes, started)
    return changes


def door_switch_off(deployment: Deployment, name: str, replica: Replica) -> float:
    """A canary's rollback: weight 0 for `name` on `replica`, so that its next
    request goes elsewhere. Returns the seconds until HAProxy had it (the
    runtime command's round trip), measured before it is recorded. Raises
    DoorError if HAProxy refused."""
    door = front_door_for(deployment)
    if door is None:
        return 0.0
    started = time.monotonic()
    try:
        changes = door.weigh(name, {server_name(replica.pk): 0})
    except DoorError as error:
        _record(deployment, [], started, error=str(error))
        raise
    seconds = time.monotonic() - started
    _record(deployment, changes, started)
    return seconds


def door_samples(deployment: Deployment, name: str):
    """(epoch, {replica id: ServerSample}) of `name`'s backend, or None without
    a front door. A read: nothing is recorded."""
    door = front_door_for(deployment)
    if door is None:
        return None
    epoch, samples = door.samples(name)
    ids = {server_name(pk): pk for pk in deployment.replicas.values_list("pk", flat=True)}
    return epoch, {ids[server]: sample for server, sample in samples.items() if server in ids}


def _each(deployment: Deployment, replicas: list[Replica], change) -> list[str]:
    """`change(server)` for each replica, recorded. A front door that fails is
    logged and recorded, and the rollout goes on: a swap's own verification
    does not depend on it, and the next sync puts the routes right."""
    changes = []
    for replica in replicas:
        started = time.monotonic()
        try:
            done = change(server_name(replica.pk))
        except DoorError as error:
            logger.warning("front door of %s: %s", deployment.name, error)
            _record(deployment, [f"{server_name(replica.pk)}/ failed"], started, error=str(error))
            continue
        _record(deployment, done, started)
        changes += done
    return changes


def _unheld(table: RoutingTable, name: str) -> RoutingTable:
    routes = dict(table.routes)
    routes[name] = replace(routes[name], held=False)
    return replace(table, routes=routes)


def _record(
    deployment: Deployment,
    changes: list[str],
    started: float,
    error: str = "",
    replica: Replica | None = None,
) -> None:
    """One attempt row per change that names a replica's server (`.../r<id> ...`),
    or, given `replica`, per change made for it (a hold of its adapter)."""
    if not changes and not error:
        return
    duration = (time.monotonic() - started) * 1000 / max(len(changes), 1)
    ids = {server_name(pk): pk for pk in deployment.replicas.values_list("pk", flat=True)}
    rows = []
    for change in changes or [error]:
        server = next((ids[word] for word in _servers_in(change) if word in ids), None)
        if server is None and replica is not None:
            server = replica.pk
        if server is None:
            logger.info("front door of %s: %s", deployment.name, change)
            continue
        rows.append(
            HttpAttempt(
                replica_id=server,
                purpose="gateway",
                method="RUNTIME",
                url=f"haproxy:{deployment.name} {change}"[:1000],
                started_at=timezone.now(),
                duration_ms=duration,
                status_code=None,
                ok=not error and "still in flight" not in change,
                transient=bool(error),
                error=error[:4000],
            )
        )
    HttpAttempt.objects.bulk_create(rows)


def _servers_in(change: str) -> list[str]:
    return [part.rsplit("/", 1)[-1] for part in change.replace(":", " ").split() if "/" in part]


def door_swaps_one_by_one(deployment: Deployment, served) -> bool:
    """Whether a rollout of `served` is a version swap behind a front door:
    then it drains, swaps and puts back one replica at a time. A first load
    needs none of it: no request is routed to an adapter before it is verified."""
    return served.version_id is not None and front_door_for(deployment) is not None
