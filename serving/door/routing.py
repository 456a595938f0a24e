"""Which replica should get the requests for which model: a pure function of
what the database knows (the desired routing table), and its selector.

A replica serves an adapter when the control plane has verified it loaded
there: its last observed `/v1/models` lists the adapter's served name from the
path the deployment serves now. The base model's name goes to every replica
that is not down. A model that is not in the table is not served: 404.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class ServerState(enum.StrEnum):
    READY = "ready"  # gets new requests
    DRAIN = "drain"  # finishes what it has, gets nothing new
    MAINT = "maint"  # gets nothing


@dataclass(frozen=True)
class Endpoint:
    """One replica as the door addresses it. `server` is stable for the
    replica's lifetime (its database id), so states survive a reload."""

    server: str
    host: str
    port: int
    tls: bool


@dataclass(frozen=True)
class Route:
    model: str
    states: Mapping[str, ServerState]  # server -> state, one entry per endpoint
    # A rollout holds this adapter's claim and moves its states itself (drain,
    # swap, verify, ready): a sync from the table must leave them alone.
    held: bool = False
    base: bool = False
    # A canary's split, {server: weight} (weighted round robin); empty: equal.
    weights: Mapping[str, int] = field(default_factory=dict)

    def ready_servers(self) -> list[str]:
        return sorted(s for s, state in self.states.items() if state == ServerState.READY)


@dataclass(frozen=True)
class RoutingTable:
    deployment: str
    base_model: str
    endpoints: tuple[Endpoint, ...]
    routes: Mapping[str, Route]


@dataclass(frozen=True)
class ReplicaView:
    id: int
    base_url: str
    down: bool
    loaded: Mapping[str, str]  # served name -> root, as last observed


@dataclass(frozen=True)
class ServedView:
    name: str
    path: str
    held: bool
    weights: Mapping[str, int] = field(default_factory=dict)


def server_name(replica_id: int) -> str:
    return f"r{replica_id}"


def endpoint_for(replica: ReplicaView) -> Endpoint:
    parts = urlsplit(replica.base_url)
    tls = parts.scheme == "https"
    return Endpoint(
        server=server_name(replica.id),
        host=parts.hostname or "",
        port=parts.port or (443 if tls else 80),
        tls=tls,
    )


def routing_table(
    *,
    deployment: str,
    base_model: str,
    replicas: Iterable[ReplicaView],
    served: Iterable[ServedView],
) -> RoutingTable:
    """The desired table. `served` is what the deployment is meant to serve
    (retired adapters are not in it); `replicas` the active replicas."""
    replicas = sorted(replicas, key=lambda r: r.id)
    endpoints = tuple(endpoint_for(r) for r in replicas)
    routes: dict[str, Route] = {
        base_model: Route(
            model=base_model,
            states={
                server_name(r.id): ServerState.MAINT if r.down else ServerState.READY
                for r in replicas
            },
            base=True,
        )
    }
    for adapter in served:
        if adapter.name == base_model:
            continue  # never shadow the base model
        routes[adapter.name] = Route(
            model=adapter.name,
            states={
                server_name(r.id): (
                    ServerState.READY
                    # sync_state.classify's IN_SYNC, kept here without Django: this
                    # module renders the front door's configuration in benches and
                    # tools that have no settings (bench/swap_through_gateway.py).
                    if not r.down and r.loaded.get(adapter.name) == adapter.path
                    else ServerState.MAINT
                )
                for r in replicas
            },
            held=adapter.held,
            weights=dict(adapter.weights),
        )
    return RoutingTable(
        deployment=deployment, base_model=base_model, endpoints=endpoints, routes=routes
    )
