"""A deployment's desired door state as one JSON document: what every door of
the deployment pulls (serving/door/agent.py) and what the control plane writes,
a generation at a time (serving/door/fleet.py).

Pure values and their codec, with no Django: the agent runs in the door's
container, which holds no application secret and no database URL.

The document carries:
- the routing table, each route's server states and weights exactly as the
  door must apply them (a rollout's drain, a canary's split: no route is
  "held" here, the control plane resolved that before writing);
- the holds: served name -> (owner, until in epoch ms);
- who may call what (DoorAccess), the replicas' vLLM key among it;
- the bounds a door works with: its lease, how long it waits for a drained
  replica's requests before it acknowledges.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.door.callers import CallerKey, DoorAccess
from serving.door.routing import Endpoint, Route, RoutingTable, ServerState
from serving.rules.quotas import Limited

FORMAT = 1


@dataclass(frozen=True)
class Hold:
    owner: str
    until_ms: int  # epoch ms: the hold ends then, whoever forgets to release it


@dataclass(frozen=True)
class DoorDocument:
    table: RoutingTable
    access: DoorAccess
    holds: Mapping[str, Hold] = field(default_factory=dict)
    lease_seconds: float = 10.0
    drain_seconds: float = 60.0


def encode(document: DoorDocument) -> dict[str, Any]:
    table, access = document.table, document.access
    return {
        "format": FORMAT,
        "lease_seconds": document.lease_seconds,
        "drain_seconds": document.drain_seconds,
        "table": {
            "deployment": table.deployment,
            "base_model": table.base_model,
            "endpoints": [[e.server, e.host, e.port, e.tls] for e in table.endpoints],
            "routes": {
                model: {
                    "states": {server: str(state) for server, state in route.states.items()},
                    "base": route.base,
                    "weights": dict(route.weights),
                }
                for model, route in sorted(table.routes.items())
            },
        },
        "holds": {model: [hold.owner, hold.until_ms] for model, hold in document.holds.items()},
        "access": {
            "deployment": access.deployment,
            "open": access.open,
            "keys": {
                digest: [key.key_id, key.department, key.expires_at]
                for digest, key in sorted(access.keys.items())
            },
            "allowed": sorted([dept, model] for dept, model in access.allowed),
            "upstream_key": access.upstream_key,
            "versions": dict(access.versions),
            "rpm": dict(access.rpm),
            "limited": {
                entry: [limited.until, limited.limit, limited.value]
                for entry, limited in sorted(access.limited.items())
            },
            "grant_ends": sorted([d, m, end] for (d, m), end in access.grant_ends.items()),
        },
    }


class DocumentError(ValueError):
    """A document this agent cannot read: it keeps the state it has."""


def decode(data: Mapping[str, Any]) -> DoorDocument:
    if data.get("format") != FORMAT:
        raise DocumentError(f"door state format {data.get('format')!r}, this door reads {FORMAT}")
    try:
        t, a = data["table"], data["access"]
        table = RoutingTable(
            deployment=t["deployment"],
            base_model=t["base_model"],
            endpoints=tuple(
                Endpoint(server=s, host=h, port=int(p), tls=bool(tls))
                for s, h, p, tls in t["endpoints"]
            ),
            routes={
                model: Route(
                    model=model,
                    states={s: ServerState(v) for s, v in r["states"].items()},
                    base=bool(r["base"]),
                    weights={s: int(w) for s, w in r["weights"].items()},
                )
                for model, r in t["routes"].items()
            },
        )
        access = DoorAccess(
            deployment=a["deployment"],
            open=bool(a["open"]),
            keys={
                digest: CallerKey(key_id=int(k), department=d, expires_at=int(e))
                for digest, (k, d, e) in a["keys"].items()
            },
            allowed=frozenset((d, m) for d, m in a["allowed"]),
            upstream_key=a["upstream_key"],
            versions={m: int(v) for m, v in a["versions"].items()},
            rpm={e: int(v) for e, v in a["rpm"].items()},
            limited={
                e: Limited(until=int(u), limit=limit, value=int(v))
                for e, (u, limit, v) in a["limited"].items()
            },
            grant_ends={(d, m): int(end) for d, m, end in a["grant_ends"]},
        )
        holds = {m: Hold(owner=o, until_ms=int(u)) for m, (o, u) in data["holds"].items()}
        return DoorDocument(
            table=table,
            access=access,
            holds=holds,
            lease_seconds=float(data["lease_seconds"]),
            drain_seconds=float(data["drain_seconds"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise DocumentError(f"door state unreadable: {error!r}") from None
