"""Placement's writes: each tick's placement of a deployment's adapters (called by
the reconcile), the placement of the one adapter a rollout holds, the demand
observability reads from vLLM's /metrics, and the bounds a person sets.

The decisions are serving.rules.placement_plan's (pure); this module only feeds it what
the database says and stores what changed. An adapter with no bounds is on
every replica and stores nothing, so a deployment that never sets bounds
writes nothing here at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Q, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from core.actors import Actor
from core.audit import audit_record
from core.errors import ValidationFailed
from core.models import Ability
from registry.models import Adapter
from serving.deploy_access import require_may_deploy
from serving.models import Deployment, Replica, ReplicaHealth, ServedAdapter
from serving.rules.placement_plan import (
    ReplicaSlot,
    Result,
    Settings,
    State,
    Wish,
    is_bounded,
    place,
)

# The most replicas a bound may name (the column is a small integer).
MAX_BOUND = 1024


def placement_settings() -> Settings:
    return Settings(
        window_seconds=settings.SERVING_PLACEMENT_WINDOW_SECONDS,
        quiet_seconds=settings.SERVING_PLACEMENT_QUIET_SECONDS,
        churn_budget=settings.SERVING_PLACEMENT_CHURN_BUDGET,
        demand_per_replica=settings.SERVING_PLACEMENT_DEMAND_PER_REPLICA,
    )


def demand_of(replicas: Iterable[Replica]) -> dict[str, float]:
    """Per served name, the demand the replicas' last /metrics readings showed."""
    total: dict[str, float] = {}
    for replica in replicas:
        for name, units in (getattr(replica, "lora_demand", None) or {}).items():
            try:
                total[name] = total.get(name, 0.0) + float(units)
            except (TypeError, ValueError):
                continue
    return total


def _held(served: ServedAdapter, now) -> bool:
    return served.lease_until is not None and served.lease_until > now


def wishes_of(served: Iterable[ServedAdapter], demand: Mapping[str, float], now) -> list[Wish]:
    """What placement needs of each adapter that is meant to be served."""
    return [
        Wish(
            name=s.adapter.served_name,
            min_replicas=s.min_replicas,
            max_replicas=s.max_replicas,
            demand=demand.get(s.adapter.served_name, 0.0),
            previous=State.from_dict(s.placement),
            held=_held(s, now),
        )
        for s in served
        if s.version_id is not None
    ]


def replica_capacity(deployment: Deployment) -> int:
    """What placement fills one replica to: the deployment's placement_capacity,
    else its host cache (max_cpu_loras)."""
    return deployment.placement_capacity or deployment.max_cpu_loras


def slots_of(
    deployment: Deployment, replicas: Iterable[Replica], up: set[int]
) -> list[ReplicaSlot]:
    capacity = replica_capacity(deployment)
    return [ReplicaSlot(key=r.pk, capacity=capacity, up=r.pk in up) for r in replicas]


def placement_compute(
    deployment: Deployment,
    served: Iterable[ServedAdapter],
    replicas: Iterable[Replica],
    *,
    up: set[int],
    now=None,
) -> Result:
    """Every adapter's placement now, from the rows as read (no query)."""
    now = now or timezone.now()
    served = list(served)
    last = deployment.last_reconciled_at
    elapsed = (now - last).total_seconds() if last else settings.SERVING_RECONCILE_INTERVAL_SECONDS
    return place(
        wishes_of(served, demand_of(replicas), now),
        slots_of(deployment, replicas, up),
        settings=placement_settings(),
        now=now.timestamp(),
        elapsed=elapsed,
    )


def placement_tick(
    deployment: Deployment,
    served: Mapping[str, ServedAdapter],
    replicas: list[Replica],
    *,
    up: set[int],
    now=None,
) -> Result:
    """The reconcile's placement step: computes every adapter's placement,
    stores the bounded ones that changed (one UPDATE, none when nothing did) and
    sets them on the rows in `served` for the rest of the tick. An adapter a
    rollout holds keeps its placement: the rollout placed it and may be
    loading it right now."""
    now = now or timezone.now()
    result = placement_compute(deployment, served.values(), replicas, up=up, now=now)
    changed = {}
    for name, state in result.states.items():
        row = served.get(name)
        if row is None or not is_bounded(row.min_replicas, row.max_replicas):
            continue
        if _held(row, now) or State.from_dict(row.placement) == state:
            continue
        row.placement = state.as_dict()
        changed[row.pk] = row.placement
    _store(changed, now)
    return result


def _store(placements: dict[int, dict], now) -> None:
    """One UPDATE for every changed row, none of them claimed by a rollout
    meanwhile (the claim filter is in the statement: a rollout that took the
    adapter since the tick read it keeps its own placement)."""
    if not placements:
        return
    column = ServedAdapter._meta.get_field("placement")
    cases = [When(pk=pk, then=Value(v, output_field=column)) for pk, v in placements.items()]
    ServedAdapter.objects.filter(pk__in=list(placements)).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lte=now)
    ).update(placement=Cast(Case(*cases, output_field=column), output_field=column))


def placement_targets(
    deployment: Deployment, served: ServedAdapter, replicas: list[Replica]
) -> tuple[list[Replica], State | None]:
    """The replicas a rollout of `served` (whose claim the caller holds) pushes
    to: every replica for an adapter without bounds, else its placement, made
    now if it has none on these replicas yet (a first rollout) and stored.
    Returns (replicas, the placement; None for an adapter without bounds)."""
    if not is_bounded(served.min_replicas, served.max_replicas):
        return replicas, None
    # A placed replica that is down does not count: the placement moves off it,
    # as the reconcile's next tick would move it.
    up = {r.pk for r in replicas if r.health != ReplicaHealth.DOWN}
    state = State.from_dict(served.placement)
    placed = [k for k in state.replicas if k in up]
    if not placed or len(placed) < state.wanted:
        # Under the deployment's row lock (no HTTP inside): rollouts running side
        # by side each placed their adapter from the same counts, and a replica
        # got one more than its capacity (seen on real vLLM: 21 and 19 of 2 x 20).
        with transaction.atomic():
            Deployment.objects.select_for_update(no_key=True).filter(pk=deployment.pk).exists()
            state = _place_first(deployment, served, replicas, up)
        placed = list(state.replicas)
    return [r for r in replicas if r.pk in set(placed)], state


def _place_first(
    deployment: Deployment, served: ServedAdapter, replicas: list[Replica], up: set[int]
) -> State:
    now = timezone.now()
    rows = (
        ServedAdapter.objects.filter(deployment=deployment)
        .filter(Q(version__isnull=False) | Q(lease_until__gt=now))
        .exclude(pk=served.pk)
        .select_related("adapter")
        .only(
            "adapter__served_name",
            "version_id",
            "min_replicas",
            "max_replicas",
            "placement",
            "lease_until",
        )
    )
    # Served adapters, and those another rollout placed for their first version
    # (served from when it succeeds; its slot is taken already).
    others = [_as_served(row) for row in rows if row.version_id is not None or row.placement]
    # The adapter about to be served: a version to place, and not held (the
    # claim is this rollout's own: a held adapter keeps what it has, here nothing).
    me = ServedAdapter(
        pk=served.pk,
        adapter=served.adapter,
        version_id=served.version_id or -1,
        min_replicas=served.min_replicas,
        max_replicas=served.max_replicas,
        placement=served.placement,
    )
    result = placement_compute(deployment, [*others, me], replicas, up=up, now=now)
    state = result.states[served.adapter.served_name]
    served.placement = state.as_dict()
    ServedAdapter.objects.filter(pk=served.pk).update(placement=served.placement)
    return state


def _as_served(row: ServedAdapter) -> ServedAdapter:
    """The row as placement sees an adapter to serve: a version to place (a
    first rollout's row has none yet)."""
    if row.version_id is not None:
        return row
    return ServedAdapter(
        pk=row.pk,
        adapter=row.adapter,
        version_id=-1,
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        placement=row.placement,
        lease_until=row.lease_until,
    )


def replica_demand_report(replicas: Iterable[Replica], demand: Mapping[int, dict]) -> int:
    """Records each replica's per-adapter demand from its last /metrics reading
    (`demand`: replica id -> {served name: units}); a replica whose demand is
    as recorded costs nothing. Returns how many rows were written."""
    written = 0
    for replica in replicas:
        if replica.pk not in demand:
            continue
        wanted = {name: units for name, units in demand[replica.pk].items() if units}
        if (replica.lora_demand or {}) == wanted:
            continue
        replica.lora_demand = wanted
        Replica.objects.filter(pk=replica.pk).update(lora_demand=wanted)
        written += 1
    return written


def served_placement_set(
    *,
    actor: Actor,
    deployment: Deployment,
    adapter: Adapter,
    min_replicas: int | None,
    max_replicas: int | None,
) -> ServedAdapter:
    """Sets how many replicas hold the adapter on the deployment (both None:
    every replica), also before its first promotion. Whoever may promote it
    there may (a token needs the promote ability). The next reconcile, or the
    next rollout, places it; nothing is loaded or unloaded here."""
    require_may_deploy(actor, deployment, adapter, Ability.PROMOTE)
    problems = {}
    for field, value in (("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and (not whole or not 1 <= value <= MAX_BOUND):
            problems[field] = f"must be a whole number from 1 to {MAX_BOUND}, or null"
    if (
        not problems
        and min_replicas is not None
        and max_replicas is not None
        and min_replicas > max_replicas
    ):
        problems["min_replicas"] = f"must not be above max_replicas ({max_replicas})"
    if problems:
        raise ValidationFailed(
            "Placement bounds are not valid.", code="invalid_bounds", details=problems
        )
    with transaction.atomic():
        ServedAdapter.objects.get_or_create(deployment=deployment, adapter=adapter)
        row = ServedAdapter.objects.select_for_update(no_key=True).get(
            deployment=deployment, adapter=adapter
        )
        before = {"min_replicas": row.min_replicas, "max_replicas": row.max_replicas}
        row.min_replicas, row.max_replicas = min_replicas, max_replicas
        if not is_bounded(min_replicas, max_replicas):
            row.placement = {}
        row.save(update_fields=["min_replicas", "max_replicas", "placement", "updated_at"])
        audit_record(
            actor=actor,
            action="placement.bounds_set",
            obj=row,
            department=adapter.department,
            details={
                "deployment": deployment.name,
                "adapter": adapter.served_name,
                "before": before,
                "after": {"min_replicas": min_replicas, "max_replicas": max_replicas},
            },
        )
    return row


def served_placement_moved(served: ServedAdapter, moves: Mapping[int, int]) -> dict:
    """The placement of `served` with each replica `moves` names ({from: to})
    replaced: where a swap made before break left the adapter."""
    state = State.from_dict(served.placement)
    moved = tuple(moves.get(key, key) for key in state.replicas)
    return dataclasses.replace(state, replicas=moved).as_dict()
