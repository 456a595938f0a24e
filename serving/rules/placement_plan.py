"""The placement plan: which replicas of a deployment hold which adapter.

A pure function of plain values (no Django), so the reconcile, the rollout
engine, the gate, the pages and bench/placement.py all compute the same answer.

- Each adapter gets a replica count between its `min_replicas` and
  `max_replicas`. Both unset (the default) means every replica, as before
  placement existed: such an adapter is on every active replica, and vLLM's LRU
  host cache copes with more adapters than `max_cpu_loras` (serving.gate says
  what that costs).
- Between the bounds the count follows demand: the requests running and
  waiting for the adapter that vLLM's `/metrics` showed (one unit per replica
  listing it running, one more per replica listing it waiting), smoothed
  exponentially over a window. Scaling up is at once; scaling down waits until
  fewer replicas have been wanted for a quiet period, so a lull does not unload
  what the next burst needs.
- The replicas are chosen by rendezvous (highest random weight) hashing of the
  adapter's name and the replica's key, and a placement already made stays
  where it is while its replica is up and has room: losing a replica moves only
  the adapters it held, adding one moves none.
- No bounded adapter is placed on a replica already holding its capacity
  (`max_cpu_loras`, the host cache, unless the deployment sets a
  `placement_capacity`); where none has room the placement says so ("no room").
- A churn budget bounds the loads and unloads one tick may start; what is left
  waits for the next tick. Loads that give an adapter its first replica go first.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Reason(StrEnum):
    EVERYWHERE = "everywhere"  # no bounds: every replica, as before placement
    DEMAND = "demand"  # placed by demand, between the bounds
    MIN = "min"  # held at min_replicas: demand wants fewer
    MAX = "max"  # capped at max_replicas: demand wants more
    NO_ROOM = "no_room"  # fewer replicas than wanted had room (max_cpu_loras)
    HELD = "held"  # a rollout holds the adapter: its placement is left as it is


REASON_TEXT = {
    Reason.EVERYWHERE: "on every replica (no min_replicas or max_replicas set)",
    Reason.DEMAND: "placed by demand",
    Reason.MIN: "held at min_replicas",
    Reason.MAX: "capped at max_replicas",
    Reason.NO_ROOM: "no room",
    Reason.HELD: "held by a rollout in progress",
}

# Smoothed demand below this is none: the decay ends, and so do the writes.
_NEGLIGIBLE = 0.01


@dataclass(frozen=True)
class Settings:
    window_seconds: float = 60.0  # the smoothing's time constant
    quiet_seconds: float = 300.0  # fewer replicas wanted this long before any goes
    churn_budget: int = 32  # loads + unloads per tick; 0: no limit
    demand_per_replica: float = 1.0  # smoothed demand one replica carries


@dataclass(frozen=True)
class ReplicaSlot:
    """One active replica: `key` is its stable id (the database id)."""

    key: int
    capacity: int  # placement_capacity, else max_cpu_loras
    up: bool = True


@dataclass(frozen=True)
class State:
    """An adapter's placement as stored (ServedAdapter.placement)."""

    replicas: tuple[int, ...] = ()
    reason: str = ""
    wanted: int = 0
    demand: float = 0.0  # smoothed
    low_since: float | None = None  # epoch seconds since fewer replicas were wanted
    detail: str = ""

    def as_dict(self) -> dict:
        return {
            "replicas": list(self.replicas),
            "reason": self.reason,
            "wanted": self.wanted,
            "demand": self.demand,
            "low_since": self.low_since,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Mapping | None) -> State:
        data = data or {}
        try:
            return cls(
                replicas=tuple(int(k) for k in data.get("replicas") or ()),
                reason=str(data.get("reason") or ""),
                wanted=int(data.get("wanted") or 0),
                demand=float(data.get("demand") or 0.0),
                low_since=(float(data["low_since"]) if data.get("low_since") is not None else None),
                detail=str(data.get("detail") or ""),
            )
        except (TypeError, ValueError):
            return cls()  # a hand-edited row: placed again from scratch


@dataclass(frozen=True)
class Wish:
    """One adapter's input to a placement round."""

    name: str
    min_replicas: int | None = None
    max_replicas: int | None = None
    demand: float = 0.0  # this reading's raw demand (running + waiting)
    previous: State = field(default_factory=State)
    held: bool = False

    @property
    def bounded(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


@dataclass(frozen=True)
class Result:
    states: dict[str, State]
    loads: int = 0  # placements added this tick
    unloads: int = 0  # placements removed from replicas that are up
    deferred: int = 0  # changes left to a later tick by the churn budget

    def changed(self, previous: Mapping[str, State]) -> dict[str, State]:
        return {n: s for n, s in self.states.items() if previous.get(n) != s}


def score(name: str, key: int) -> int:
    """The rendezvous weight of replica `key` for adapter `name`."""
    digest = hashlib.blake2b(f"{name}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(name: str, keys: Iterable[int]) -> list[int]:
    """`keys` in the adapter's order of preference, best first."""
    return sorted(keys, key=lambda k: score(name, k), reverse=True)


def smooth(previous: float, raw: float, elapsed: float, window: float) -> float:
    """Exponential smoothing with time constant `window`, of a reading taken
    `elapsed` seconds after the previous one."""
    if window <= 0:
        value = raw
    else:
        alpha = 1.0 - math.exp(-max(elapsed, 0.0) / window)
        value = previous + alpha * (raw - previous)
    return 0.0 if value < _NEGLIGIBLE else round(value, 3)


def bounds(wish: Wish, replicas: int) -> tuple[int, int]:
    """(lowest, highest) count for a bounded adapter on `replicas` replicas
    that are up. An unset min is the max (an adapter capped at 1 is on 1)."""
    high = min(wish.max_replicas if wish.max_replicas is not None else replicas, replicas)
    low = wish.min_replicas if wish.min_replicas is not None else high
    return min(low, high), high


def place(
    wishes: Iterable[Wish],
    replicas: Iterable[ReplicaSlot],
    *,
    settings: Settings = Settings(),  # noqa: B008 - frozen, so one shared default is safe
    now: float,
    elapsed: float,
) -> Result:
    """Every adapter's placement for this tick. `elapsed`: seconds since the
    previous tick (how much the smoothing moves); `now`: epoch seconds."""
    wishes = sorted(wishes, key=lambda w: w.name)
    slots = sorted(replicas, key=lambda r: r.key)
    active = [r.key for r in slots]
    up = {r.key for r in slots if r.up}
    capacity = {r.key: r.capacity for r in slots}
    occupancy = dict.fromkeys(active, 0)
    states: dict[str, State] = {}

    # Unbounded and held adapters first: they are where they are, and take room.
    for wish in wishes:
        if wish.held:
            kept = tuple(k for k in wish.previous.replicas if k in occupancy)
            states[wish.name] = replace(wish.previous, replicas=kept)
        elif not wish.bounded:
            kept = tuple(active)
            states[wish.name] = State(replicas=kept, reason=Reason.EVERYWHERE, wanted=len(kept))
        else:
            continue
        for key in kept:
            occupancy[key] += 1

    # Bounded adapters: how many replicas each wants, and what it keeps.
    targets: dict[str, int] = {}
    kept_by: dict[str, list[int]] = {}
    notes: dict[str, dict] = {}
    bounded = [w for w in wishes if w.bounded and not w.held]
    for wish in bounded:
        low, high = bounds(wish, len(up))
        demand = smooth(wish.previous.demand, wish.demand, elapsed, settings.window_seconds)
        per = settings.demand_per_replica if settings.demand_per_replica > 0 else 1.0
        asked = math.ceil(demand / per - 1e-9) if demand else 0
        wanted = max(low, min(asked, high))
        # Placed before, on a replica that is still up: stays (HRW order breaks ties).
        still = [k for k in ranked(wish.name, wish.previous.replicas) if k in up]
        low_since = wish.previous.low_since
        target = wanted
        if wanted < len(still) and len(still) <= high:
            # Fewer wanted: only after the quiet period (bounds lowered: at once).
            low_since = now if low_since is None else low_since
            if now - low_since < settings.quiet_seconds:
                target = len(still)
            else:
                low_since = None
        else:
            low_since = None
        reason = Reason.MAX if asked > high else Reason.MIN if asked <= low else Reason.DEMAND
        targets[wish.name] = target
        kept_by[wish.name] = still[:target]
        notes[wish.name] = {
            "reason": reason,
            "demand": demand,
            "low_since": low_since,
            "dropped": still[target:],
        }
        # Every placement still up keeps its room this tick, also one being
        # dropped: its unload may wait for the churn budget, and room freed by
        # an unload is only counted once it is done (the next tick).
        for key in still:
            occupancy[key] += 1

    # New placements, one round per replica count, so that every adapter gets
    # its first replica before any gets a second; busiest first within a round.
    order = sorted(bounded, key=lambda w: (-notes[w.name]["demand"], w.name))
    added: dict[str, list[int]] = {w.name: [] for w in bounded}
    no_room: set[str] = set()
    for round_ in range(1, max(targets.values(), default=0) + 1):
        for wish in order:
            mine = kept_by[wish.name] + added[wish.name]
            if targets[wish.name] < round_ or len(mine) >= round_ or wish.name in no_room:
                continue
            choice = next(
                (k for k in ranked(wish.name, up) if k not in mine and occupancy[k] < capacity[k]),
                None,
            )
            if choice is None:
                no_room.add(wish.name)
                continue
            added[wish.name].append(choice)
            occupancy[choice] += 1

    # The churn budget: first replicas first, then other loads, then unloads.
    budget = settings.churn_budget if settings.churn_budget > 0 else math.inf
    # (the how-manieth replica of its adapter it is, the adapter's turn, ...)
    turn = {w.name: i for i, w in enumerate(order)}
    loads = [
        (len(kept_by[n]) + i, turn[n], n, k)
        for n, keys in added.items()
        for i, k in enumerate(keys)
    ]
    loads.sort()
    accepted: dict[str, list[int]] = {w.name: [] for w in bounded}
    deferred = 0
    load_count = unload_count = 0
    for _nth, _turn, name, key in loads:
        if budget <= 0:
            deferred += 1
            continue
        accepted[name].append(key)
        budget -= 1
        load_count += 1
    undropped: dict[str, list[int]] = {w.name: [] for w in bounded}
    for wish in bounded:
        for key in notes[wish.name]["dropped"]:
            if budget <= 0:
                undropped[wish.name].append(key)
                deferred += 1
                continue
            budget -= 1
            unload_count += 1

    for wish in bounded:
        name, note = wish.name, notes[wish.name]
        placed = kept_by[name] + accepted[name] + undropped[name]
        reason = note["reason"]
        detail = ""
        if name in no_room:
            reason = Reason.NO_ROOM
            detail = (
                f"{len(kept_by[name]) + len(added[name])} of {targets[name]} replica(s) placed: "
                "every other replica that is up is full (its max_cpu_loras, or the "
                "deployment's placement_capacity)"
            )
        waiting = len(added[name]) - len(accepted[name]) + len(undropped[name])
        if waiting:
            detail = "; ".join(
                part for part in (detail, f"{waiting} change(s) wait for the churn budget") if part
            )
        if note["low_since"] is not None:
            detail = "; ".join(
                part
                for part in (
                    detail,
                    f"demand wants fewer: scaling down after {settings.quiet_seconds:g} s quiet",
                )
                if part
            )
        if not up:
            reason, detail = Reason.NO_ROOM, "no replica is up"
        states[name] = State(
            replicas=tuple(sorted(placed)),
            reason=reason,
            wanted=targets[name],
            demand=note["demand"],
            low_since=note["low_since"],
            detail=detail,
        )
    return Result(states=states, loads=load_count, unloads=unload_count, deferred=deferred)


def total_capacity(replicas: Iterable[ReplicaSlot]) -> int:
    return sum(r.capacity for r in replicas)


def placements_needed(wishes: Iterable[Wish], replicas: int) -> int:
    """The placements the adapters need at least on `replicas` replicas: every
    replica for an unbounded one, the lower bound for a bounded one."""
    return sum(bounds(w, replicas)[0] if w.bounded else replicas for w in wishes)


def is_bounded(min_replicas: int | None, max_replicas: int | None) -> bool:
    return min_replicas is not None or max_replicas is not None


def placed_keys(served) -> frozenset[int] | None:
    """The replica keys a ServedAdapter-like row is placed on; None: every
    replica (no bounds set, as before placement)."""
    if not is_bounded(served.min_replicas, served.max_replicas):
        return None
    # A tick asks this for every replica of every adapter: parsed once per
    # placement the row holds (a new placement is a new dict).
    cached = getattr(served, "_placed_keys", None)
    if cached is not None and cached[0] is served.placement:
        return cached[1]
    keys = frozenset(State.from_dict(served.placement).replicas)
    served._placed_keys = (served.placement, keys)
    return keys
