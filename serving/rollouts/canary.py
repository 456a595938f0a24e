"""A traffic canary, the worker's side: the new version on one replica, a stated
share of the adapter's requests sent there by the front door for the bake
time, health gates comparing it with the old version on the others, then
either every replica swapped (make before break) or the canary pulled out.

    verified on the canary replica -> baking (split at the front door, gates
    judged every second) -> passed: the others swapped one at a time, drained,
    verified, put back -> succeeded
                         -> failed: weight 0 on the canary (the traffic switch,
    milliseconds), its requests in flight finish, the old version loaded there
    again -> rolled_back

Everything the worker needs to resume is in the canary's row (Canary): its
replica, the bake deadline, the gates' counters and verdict, its state. A
worker killed mid-bake loses its claim; the sweeper sends the rollout again;
the next worker checks the canary replica (idempotent: loaded and verified
already), sets the split again and bakes on until the same deadline. The
rollout's status and the canary's state change through serving.rules.transitions
with compare-and-swap: a person's promote or abort and the gates' verdict in
the same second cannot both win (the gates lose, and the worker carries out
the person's decision).

The gates are pure functions (serving/rules/canary_gates.py); the counters are the
front door's, per server, in the adapter's backend (HAProxy's `show stat`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import audit_record
from core.state import move
from serving.door.haproxy import DoorError
from serving.door.routing import server_name
from serving.door.services import (
    door_drain,
    door_ready,
    door_samples,
    door_switch_off,
    door_sync,
    door_weigh,
    front_door_for,
)
from serving.models import (
    Canary,
    CanaryState,
    Deployment,
    Replica,
    ReplicaStepStatus,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.rollouts import steps as rollout_steps
from serving.rules import canary_gates as gates
from serving.rules.transitions import CANARY_TRANSITIONS, CANARY_UNDECIDED

logger = logging.getLogger(__name__)

# How often the gates are judged and a person's promote-now or abort is looked for.
POLL_SECONDS = 1.0


def thresholds() -> gates.Thresholds:
    return gates.Thresholds(
        min_requests=settings.SERVING_CANARY_MIN_REQUESTS,
        max_error_rate_increase=settings.SERVING_CANARY_MAX_ERROR_RATE_INCREASE,
        max_latency_ratio=settings.SERVING_CANARY_MAX_LATENCY_RATIO,
    )


def canary_refusal(deployment: Deployment, served_version_id: int | None, replicas: int) -> str:
    """Why a traffic canary cannot run here ("" if it can). Asked when it is
    requested (a 409) and again by the worker (the deployment may have changed)."""
    if front_door_for(deployment) is None:
        return (
            f"{deployment.name} has no front door (SERVING_DOORS): nothing can split its traffic."
        )
    if served_version_id is None:
        return (
            "no version of this adapter is served there yet: there is no old version "
            "to compare with."
        )
    if replicas < 2:
        return (
            f"{deployment.name} has {replicas} replica(s); a canary needs one for the new "
            "version and at least one for the old."
        )
    return ""


def canary_run(ctx, served: ServedAdapter, name: str, load, verify) -> None:
    """The rollout after staging, for a rollout with a `canary_share`."""
    row: Canary = ctx.rollout.canary
    refusal = canary_refusal(ctx.deployment, served.version_id, len(ctx.replicas))
    if refusal and row.state in CANARY_UNDECIDED:
        end_undecided(row)
        rollout_steps.finish(ctx, RolloutStatus.FAILED, f"The canary cannot run: {refusal}")
        door_sync(ctx.deployment, release=name)
        return
    canary = _canary_replica(row, ctx)
    rest = [r for r in ctx.replicas if r.pk != canary.pk]
    outcome = row.state
    reason = (row.gates.get("verdict") or {}).get("reason", "")
    if outcome in CANARY_UNDECIDED:
        if not _swap_canary(ctx, canary, name, load, verify):
            end_undecided(row)
            return
        outcome, reason = _bake(ctx, row, served, canary, rest, name)
    if outcome in (CanaryState.PASSED, CanaryState.PROMOTED):
        _promote(ctx, served, canary, rest, name, load, verify)
    else:
        _roll_back(ctx, row, served, canary, rest, name, reason)


def end_undecided(row: Canary) -> None:
    """Its rollout stopped before anything was decided (cancelled, refused, not
    verified on its replica): compare-and-swap from any undecided state."""
    Canary.objects.filter(pk=row.pk, state__in=CANARY_UNDECIDED).update(
        state=CanaryState.ENDED, decided_at=timezone.now()
    )


def canary_verified(row: Canary, replica: Replica) -> None:
    """A canary without a share of the traffic passes once the new version is
    verified on its replica (the engine then swaps the others)."""
    row.replica_id = replica.pk
    if not move(
        row,
        CANARY_TRANSITIONS,
        CanaryState.PASSED,
        field="state",
        replica=replica,
        decided_at=timezone.now(),
    ):
        raise rollout_steps.Stopped("the canary changed while it was verified")


def _canary_replica(row: Canary, ctx) -> Replica:
    """The first replica by URL (as the page lists them), fixed in the row the
    first time, so that a resumed worker bakes on the same one."""
    by_id = {r.pk: r for r in ctx.replicas}
    if row.replica_id in by_id:
        return by_id[row.replica_id]
    canary = ctx.replicas[0]
    row.replica_id = canary.pk
    Canary.objects.filter(pk=row.pk).update(replica=canary)
    return canary


def _swap_canary(ctx, canary: Replica, name: str, load, verify) -> bool:
    """Drained at the front door, the new version loaded and verified there
    (the other replicas serve meanwhile). Again on a resumed bake: the
    replica may have been repaired back while no worker held the adapter."""
    # Were this to fail, only the canary replica has changed: it alone goes back.
    ctx.rollback_order = [canary]
    return rollout_steps.swap_replica(ctx, [canary], name, load, verify, out=rollout_steps.DRAIN)


def _bake(ctx, row: Canary, served: ServedAdapter, canary: Replica, rest: list[Replica], name: str):
    """Splits the traffic and judges the gates until they decide, the bake
    ends or a person decides. Returns (state decided, reason)."""
    rollout = ctx.rollout
    deployment = ctx.deployment
    assert row.share is not None and row.bake_seconds is not None, "a canary without a split"
    if row.bake_until is None:
        row.bake_until = timezone.now() + timedelta(seconds=row.bake_seconds)
        Canary.objects.filter(pk=row.pk).update(bake_until=row.bake_until)
    rollout_steps.set_status(ctx, RolloutStatus.BAKING)
    if row.state == CanaryState.WAITING and not move(
        row, CANARY_TRANSITIONS, CanaryState.BAKING, field="state"
    ):
        raise rollout_steps.Stopped("the canary changed before it baked")
    weights = gates.split_weights(row.share, str(canary.pk), [str(r.pk) for r in rest])
    _split(ctx, served, canary, rest, name, {int(pk): w for pk, w in weights.items()})
    # A resumed bake goes on with the counts it had; a first one starts them now.
    started = "counters" in (row.gates or {})
    state = row.gates["counters"] if started else None
    if state is None:
        try:
            epoch, samples = _read(deployment, name)
            state = gates.start(samples, epoch)
        except DoorError as error:
            # Counted from the first read that works (below): never from zero,
            # which would count the old version's answers on the canary server.
            logger.warning("rollout %s: front door unreadable: %s", rollout.pk, error)
            state = None
    if not started:
        with transaction.atomic():
            report: dict[str, Any] = {"counters": state, "weights": weights, "share": row.share}
            _save_gates(row, report)
            audit_record(
                actor=None,
                action="rollout.canary_started",
                obj=rollout,
                department=rollout.adapter.department,
                to_state=RolloutStatus.BAKING,
                details={
                    "share": row.share,
                    "bake_seconds": row.bake_seconds,
                    "bake_until": row.bake_until.isoformat(),
                    # Its server at the front door, not its address: the audit
                    # log is the department's to read, the addresses the platform's.
                    "canary_server": server_name(canary.pk),
                    "weights": {server_name(int(k)): w for k, w in weights.items()},
                },
            )
    limits = thresholds()
    while True:
        try:
            ctx.watch.check()
        except rollout_steps.Stopped:
            if ctx.watch.reason == "the rollout was cancelled":
                # Cancelled: the new version takes no more of the traffic now, not
                # at the next reconcile (which puts the old version back there).
                with contextlib.suppress(DoorError):
                    door_weigh(deployment, name, {canary.pk: 0})
            raise
        try:
            epoch, samples = _read(deployment, name)
            state = (
                gates.start(samples, epoch)
                if state is None
                else gates.advance(state, samples, epoch)
            )
        except DoorError as error:
            # Unreadable for now: the counters carry on in HAProxy; judged when readable.
            logger.warning("rollout %s: front door unreadable: %s", rollout.pk, error)
            samples = {}
        if state is None:
            canary_side = old_side = gates.Side(0, 0, None)
        else:
            canary_side, old_side = gates.sides(state, samples, str(canary.pk))
        now = timezone.now()
        verdict = gates.judge(canary_side, old_side, limits, bake_over=now >= row.bake_until)
        report = {
            "counters": state,
            "weights": weights,
            "share": row.share,
            "canary": asdict(canary_side),
            "baseline": asdict(old_side),
            "verdict": verdict.as_dict(),
            "checked_at": now.isoformat(),
        }
        asked = (
            Canary.objects.filter(pk=row.pk).values_list("state", "decided_by__username").first()
        )
        current, who = asked or (CanaryState.ENDED, None)
        outcome, reason = "", ""
        if current == CanaryState.PROMOTE_ASKED:
            outcome, reason = CanaryState.PROMOTED, f"Promoted by {who} before the gates decided."
        elif current == CanaryState.ABORT_ASKED:
            outcome, reason = CanaryState.ABORTED, f"Aborted by {who}."
        elif current != CanaryState.BAKING:
            # Ended: its rollout was cancelled (rollout_cancel ends it in the
            # same transaction). No more of the traffic to it now, as below.
            with contextlib.suppress(DoorError):
                door_weigh(deployment, name, {canary.pk: 0})
            raise rollout_steps.Stopped(f"the canary is {current} now, not baking")
        elif verdict.outcome == gates.FAIL:
            outcome, reason = CanaryState.FAILED, f"Canary gates failed: {verdict.reason}"
        elif verdict.outcome == gates.PASS:
            outcome, reason = CanaryState.PASSED, f"Canary gates passed: {verdict.reason}"
        if not outcome:
            _save_gates(row, report)
            time.sleep(POLL_SECONDS)
            continue
        report["verdict"]["reason"] = reason
        row.state = current
        if canary_decide(rollout, row, outcome, reason, report):
            return outcome, reason
        # A person asked in the same second: their decision, at the next look.


def _read(deployment: Deployment, name: str):
    found = door_samples(deployment, name)
    if found is None:
        raise DoorError(f"{deployment.name} has no front door")
    epoch, samples = found
    return epoch, {str(pk): sample for pk, sample in samples.items()}


def _save_gates(row: Canary, report: dict) -> None:
    row.gates = report
    Canary.objects.filter(pk=row.pk).update(gates=report)


def canary_decide(rollout: Rollout, row: Canary, outcome: str, reason: str, report: dict) -> bool:
    """The decision, once: a compare-and-swap from the state `row` was read
    with (CANARY_TRANSITIONS), with its audit. False if the state changed
    meanwhile (a person asked first): nothing is written, the caller looks again."""
    with transaction.atomic():
        if not move(
            row, CANARY_TRANSITIONS, outcome, field="state", gates=report, decided_at=timezone.now()
        ):
            return False
        audit_record(
            actor=None,
            action=f"rollout.canary_{outcome}",
            obj=rollout,
            department=rollout.adapter.department,
            from_state=RolloutStatus.BAKING,
            comment=reason[:2000],
            details={
                "canary": report.get("canary"),
                "baseline": report.get("baseline"),
                "gates": report["verdict"]["gates"],
            },
        )
    return True


def _split(ctx, served, canary: Replica, rest: list[Replica], name: str, weights) -> None:
    """The front door sends the canary its share: the weights go into the
    desired state first (a reload renders them, in weighted round robin), then
    into the running HAProxy, the old version's servers before the canary's."""
    deployment = ctx.deployment
    ServedAdapter.objects.filter(pk=served.pk).update(
        gateway_weights={server_name(pk): w for pk, w in weights.items()}
    )
    door_sync(deployment)
    door_weigh(deployment, name, {r.pk: weights[r.pk] for r in rest})
    door_ready(deployment, name, [canary])
    door_weigh(deployment, name, {canary.pk: weights[canary.pk]})


def _unsplit(ctx, served, name: str, replicas: list[Replica]) -> None:
    ServedAdapter.objects.filter(pk=served.pk).update(gateway_weights={})
    try:
        door_weigh(ctx.deployment, name, {r.pk: 1 for r in replicas})
    except DoorError as error:  # the next sync renders equal weights
        logger.warning("rollout %s: equal weights not set: %s", ctx.rollout.pk, error)


def _promote(ctx, served, canary: Replica, rest: list[Replica], name: str, load, verify) -> None:
    """Every other replica, one at a time: drained there, swapped, verified,
    put back; the canary serves the new version throughout (make before break)."""
    _unsplit(ctx, served, name, [canary, *rest])
    swapped = [canary]
    for replica in rest:
        if ctx.steps[replica.pk].status == ReplicaStepStatus.SUCCEEDED:  # a resumed promotion
            swapped.append(replica)
            continue
        if not rollout_steps.swap_replica(
            ctx, [replica], name, load, verify,
            out=rollout_steps.DRAIN, swapped=swapped, put_back=True,
        ):  # fmt: skip
            return
    rollout_steps.succeed(ctx, served)
    door_sync(ctx.deployment, release=name)


def _roll_back(
    ctx, row: Canary, served, canary: Replica, rest: list[Replica], name: str, reason: str
) -> None:
    """The rollback is a traffic switch: weight 0 on the canary server (one
    runtime command; the next request goes to the old version), timed. Its
    requests in flight finish, then the old version is loaded there again,
    verified by the load, and the canary replica goes back into the pool."""
    rollout = ctx.rollout
    started = time.monotonic()
    try:
        switch_ms = door_switch_off(ctx.deployment, name, canary) * 1000
    except DoorError as error:
        logger.warning("rollout %s: weight 0 refused (%s); draining", rollout.pk, error)
        switch_ms = (time.monotonic() - started) * 1000
    door_drain(ctx.deployment, name, [canary])
    drained_ms = (time.monotonic() - started) * 1000
    report = dict(row.gates or {})
    report["rollback"] = {"switch_ms": round(switch_ms, 2), "drained_ms": round(drained_ms, 1)}
    with transaction.atomic():
        _save_gates(row, report)
        audit_record(
            actor=None,
            action="rollout.canary_switched_back",
            obj=rollout,
            department=rollout.adapter.department,
            comment=reason[:2000],
            details=report["rollback"],
        )
    ServedAdapter.objects.filter(pk=served.pk).update(gateway_weights={})
    ctx.rollback_order = [canary]

    def before_end(tried: bool) -> None:
        # Recorded, and the weights evened, before the rollout ends: a client
        # that sees it rolled back reads the whole report.
        if tried:  # what a rollback by reload would have cost: the old version back there
            report["rollback"]["restored_ms"] = round((time.monotonic() - started) * 1000, 1)
            _save_gates(row, report)
        _unsplit(ctx, served, name, [canary, *rest])

    rollout_steps.rollback_everywhere(
        ctx, f"{reason.rstrip('.')}. Traffic left the canary in {switch_ms:.1f} ms", before_end
    )
    door_sync(ctx.deployment, release=name)
