"""The steps a rollout is made of, shared by the engine's swaps
(serving.rollouts.engine) and the traffic canary
(serving.rollouts.canary): the compare-and-swap of the rollout's status and of
its replica steps, the fan-out to replicas with its attempts recorded, the
swap of one replica (swap_replica), the rollback, the switch back at the
front door, and the end (succeeded, failed or rolled back, audited). Public,
so that neither strategy calls the other's private names; neither is
imported here.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import audit_record
from core.claims import LeaseLost
from core.state import move
from serving.attestation import served_fact
from serving.door.services import (
    door_drain,
    door_ready,
    door_release,
    door_sync,
    door_take_out,
)
from serving.fanout import on_replicas
from serving.models import (
    Deployment,
    Replica,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.records.attempts import attempts_record_all
from serving.records.fact_records import replica_load_refusals_report
from serving.records.fingerprints import fingerprints_check_rollout
from serving.records.leases import (
    claim_seconds,
    served_adapter_heartbeat,
)
from serving.records.own_probes import own_probes_record
from serving.records.placements import (
    served_placement_moved,
)
from serving.replica_calls import (
    ReplicaOutcome,
    RetryPolicy,
    RetryStopped,
    ensure_loaded,
    ensure_unloaded,
)
from serving.rules.kept_copies import kept_copy_record
from serving.rules.transitions import (
    REPLICA_STEP_TRANSITIONS,
    ROLLOUT_TRANSITIONS,
)
from serving.signals import served_version_changed
from serving.sync_state import as_listing, loaded_adapters
from serving.volume import StagingError, mark_unreferenced, stage_version

logger = logging.getLogger(__name__)


class Stopped(Exception):
    """This worker must stop: the rollout was cancelled, or another worker holds it now."""


class Watch:
    """Keeps the worker's claim and notices a cancel. Only the rollout's own
    thread talks to the database here; the replicas' threads only `sleep`,
    which returns early (RetryStopped) once the work must stop."""

    def __init__(self, rollout_id: int, served_id: int, worker: str):
        self.rollout_id = rollout_id
        self.heartbeat = served_adapter_heartbeat(served_id, worker)
        # Cancel is looked for this often while the work goes on.
        self.interval = min(claim_seconds() / 3, 2.0)
        self._checked = time.monotonic()
        self._stop = threading.Event()
        self.reason = ""

    def check(self) -> None:
        """Renews the claim when due; raises Stopped if the work must end."""
        if self._stop.is_set():
            raise Stopped(self.reason)
        try:
            self.heartbeat.beat()
        except LeaseLost as error:
            self._halt(str(error))
        now = time.monotonic()
        if now - self._checked >= self.interval:
            self._checked = now
            status = (
                Rollout.objects.filter(pk=self.rollout_id).values_list("status", flat=True).first()
            )
            if status == RolloutStatus.CANCELLED:
                self._halt("the rollout was cancelled")

    def _halt(self, reason: str) -> None:
        self.reason = reason
        self._stop.set()
        raise Stopped(reason)

    def sleep(self, seconds: float) -> None:
        """A back-off wait in a replica's thread. Never touches the database."""
        if self._stop.wait(seconds):
            raise RetryStopped(self.reason)

    def tick(self) -> None:
        """While the replicas' threads work: renews the claim. If the work must
        stop, the threads are told to (they stop retrying) and are still waited
        for, so their attempts get recorded."""
        if not self._stop.is_set():
            # On Stopped, _halt has set the event: the threads stop retrying.
            with contextlib.suppress(Stopped):
                self.check()

    def raise_if_stopped(self) -> None:
        if self._stop.is_set():
            raise Stopped(self.reason)


def set_status(ctx: RolloutContext, status: str, **fields) -> None:
    """Compare-and-swap from the status this worker last saw."""
    ctx.watch.check()
    if not move(ctx.rollout, ROLLOUT_TRANSITIONS, status, **fields):
        now = Rollout.objects.filter(pk=ctx.rollout.pk).values_list("status", flat=True).first()
        raise Stopped(f"the rollout is {now} now, not {ctx.rollout.status}")


def set_steps(steps: list[ReplicaRollout], status: str, errors: dict[int, str] | None = None):
    """Compare-and-swap of replica steps, one UPDATE per (old status, error)
    (usually one for every replica: each statement is a round trip on the
    rollout's critical path). Steps the table does not let move are left alone."""
    groups: dict[tuple[str, str], list[ReplicaRollout]] = {}
    for step in steps:
        if step.status != status and status not in REPLICA_STEP_TRANSITIONS[step.status]:
            continue
        # A failed step keeps its reason when it is then rolled back.
        keep = status in (ReplicaStepStatus.FAILED, ReplicaStepStatus.ROLLED_BACK)
        error = (errors or {}).get(step.replica_id, step.error if keep else "")
        groups.setdefault((step.status, error), []).append(step)
    for (old, error), group in groups.items():
        moved = ReplicaRollout.objects.filter(pk__in=[s.pk for s in group], status=old).update(
            status=status, error=error, updated_at=timezone.now()
        )
        if moved != len(group):
            raise Stopped("the rollout's replica steps were changed by someone else")
        for step in group:
            step.status, step.error = status, error


@dataclass
class RolloutContext:
    rollout: Rollout
    deployment: Deployment
    replicas: list[Replica]  # the ones this rollout pushes to (deferred ones are not)
    steps: dict[int, ReplicaRollout]
    policy: RetryPolicy
    watch: Watch
    # Behind a front door, the order a rollback goes through the replicas one
    # at a time, each drained there first (make before break); None: all at once.
    rollback_order: list[Replica] | None = None
    # A swap behind a front door (serving.rules.kept_copies.swap_plan): the replicas
    # that keep the version before, drained, for SERVING_ROLLBACK_RETAIN_SECONDS
    # (a rollback meanwhile is a switch of traffic) ...
    keep: list[Replica] = field(default_factory=list)
    # ... the replicas pushed to that did not serve the adapter before (a
    # rollback unloads it there), and {placed replica: spare} (the placement follows).
    spares: frozenset[int] = frozenset()
    moved: dict[int, int] = field(default_factory=dict)
    # Whether the traffic has left the replicas on the version before already
    # (switch_to_kept): a failure then puts the kept ones back first.
    switched: bool = False
    # Names this worker's holds at the front door (only its own are released):
    # a worker that resumes the rollout after a lost claim holds under its own.
    hold_owner: str = field(default_factory=lambda: secrets.token_hex(8))


def fan_out(
    ctx: RolloutContext, replicas: list[Replica], work, *, probes: str = ""
) -> dict[int, ReplicaOutcome]:
    """Runs `work(client, replica)` on every replica at once (serving.fanout);
    records attempts after. `probes`: the adapter the work sends requests
    through (verification), marked as the control plane's own before and after
    so that /metrics does not count them as demand (serving.records.own_probes)."""
    if probes:
        own_probes_record(replicas, [probes])
    try:
        results = on_replicas(
            ctx.deployment, replicas, work, tick=ctx.watch.tick, interval=ctx.watch.interval
        )
    finally:
        if probes:
            own_probes_record(replicas, [probes])
    outcomes = {r.pk: outcome for r, outcome in zip(replicas, results, strict=True)}
    attempts_record_all([(r, outcomes[r.pk], ctx.steps.get(r.pk)) for r in replicas])
    for replica in replicas:
        outcome = outcomes[replica.pk]
        if outcome.vllm_version and outcome.vllm_version != replica.vllm_version:
            replica.vllm_version = outcome.vllm_version
            Replica.objects.filter(pk=replica.pk).update(vllm_version=outcome.vllm_version)
    ctx.watch.raise_if_stopped()
    return outcomes


def end_rollback(
    ctx: RolloutContext,
    outcomes: dict[int, ReplicaOutcome],
    *,
    failed: Callable[[str], str],
    succeeded: str,
) -> None:
    """Marks the steps that were undone, then ends the rollout: FAILED, naming
    each replica where undoing failed (the reconcile keeps trying), else ROLLED_BACK."""
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    set_steps([s for pk, s in ctx.steps.items() if pk not in errors], ReplicaStepStatus.ROLLED_BACK)
    if errors:
        by_url = {r.pk: r.base_url for r in ctx.replicas}
        detail = "; ".join(f"{by_url[pk]}: {m}" for pk, m in errors.items())
        finish(ctx, RolloutStatus.FAILED, failed(detail))
        return
    finish(ctx, RolloutStatus.ROLLED_BACK, succeeded)


def switch_to_kept(ctx: RolloutContext, name: str, others: list[Replica]) -> None:
    """The replicas holding the version swapped in (kept copies) serve it
    again: the traffic leaves `others` and those that keep the version
    before at once (the runtime API, milliseconds)."""
    door_drain(ctx.deployment, name, [*others, *(r for r in ctx.keep if r not in others)])
    ctx.switched = True


def switch_back(ctx: RolloutContext, name: str, failed: list[Replica], swapped: list[Replica]):
    """A swap failed on `failed`: the traffic goes back to the replicas that
    keep the version before (if a switch had left them) and leaves the
    replicas already on the new version at once (the runtime API,
    milliseconds); then the rollback goes one replica at a time, the failed
    one first, so that one always serves."""
    if ctx.switched:
        door_ready(ctx.deployment, name, [r for r in ctx.keep if r not in ctx.replicas])
    door_drain(ctx.deployment, name, swapped)
    rest = [r for r in ctx.replicas if r not in failed and r not in swapped]
    ctx.rollback_order = [*failed, *swapped, *rest]


# How a swap takes its replicas out at the front door first (swap_replica).
TAKE_OUT = "take_out"  # drained, or its new requests held where it is the only one
DRAIN = "drain"  # drained: the others serve meanwhile
LEAVE = ""  # nothing to take out: no door, or the replica serves no version of it yet

Work = Callable[..., ReplicaOutcome]


def swap_replica(
    ctx: RolloutContext,
    group: list[Replica],
    name: str,
    load: Work,
    verify: Work,
    *,
    out: str = LEAVE,
    swapped: list[Replica] | None = None,
    put_back: bool = False,
) -> bool:
    """The swap of one replica (or of a group swapped at once): taken out at
    the front door (`out`), loaded, verified, fingerprinted, put back
    (`put_back`), its step succeeded. The one sequence the promotion, the
    canary and its promotion run.

    On a failure the rollout is rolled back here and ended, and False is
    returned. `swapped`: the replicas this rollout already swapped one at a
    time; given, a failure first sends the traffic back to the replicas that
    keep the version before (switch_back), and a success joins the list."""
    steps = [ctx.steps[r.pk] for r in group]
    enter_phase(ctx, steps, RolloutStatus.LOADING, ReplicaStepStatus.LOADING)
    with taken_out(ctx, name, group, out) as taken:
        if taken is not None and taken.busy:
            # Never unloaded under requests it still runs (SERVING_DOOR_DRAIN_SECONDS).
            loaded = {
                r.pk: ReplicaOutcome().fail(
                    f"{taken.busy} request(s) through {name} were still running there "
                    f"after {settings.SERVING_DOOR_DRAIN_SECONDS:g} s "
                    "(SERVING_DOOR_DRAIN_SECONDS); not swapped while they run."
                )
                for r in group
            }
        else:
            loaded = fan_out(ctx, group, load)
        phase = "drain" if taken is not None and taken.busy else "load"
        if _rolled_back(ctx, steps, group, name, loaded, phase, swapped):
            return False
        enter_phase(ctx, steps, RolloutStatus.VERIFYING, ReplicaStepStatus.VERIFYING)
        verified = fan_out(ctx, group, verify, probes=name)
        fingerprints_check_rollout(rollout=ctx.rollout, replicas=group, outcomes=verified)
        if _rolled_back(ctx, steps, group, name, verified, "verification", swapped):
            return False
        if put_back:
            door_ready(ctx.deployment, name, group)
        if swapped is not None:
            swapped += group
    set_steps(steps, ReplicaStepStatus.SUCCEEDED)
    return True


def _rolled_back(ctx, steps, group, name, outcomes, phase: str, swapped) -> bool:
    if swapped is not None and not all(o.ok for o in outcomes.values()):
        switch_back(ctx, name, group, swapped)
    if rollback_if_failed(ctx, steps, outcomes, phase):
        door_sync(ctx.deployment, release=name)
        return True
    return False


@contextlib.contextmanager
def taken_out(ctx: RolloutContext, name: str, group: list[Replica], how: str):
    """The swap's replicas out of the front door's rotation for the block.

    TAKE_OUT (a group of one): door_take_out, drained or, where it is the
    only one serving `name`, `name`'s new requests held at the door; the hold
    ends when the block does, whichever way (after the replica is back, or
    after a failure's switch back and rollback). A worker that dies meanwhile
    leaves a hold that its deadline ends (door.lua) and the next sync removes.
    Yields what door_take_out found (its `busy` requests), else None.
    DRAIN: drained only (a canary: the other replicas serve)."""
    taken = None
    if how == TAKE_OUT:
        [replica] = group
        # The wait for its requests in flight renews the claim; a cancel or a
        # lost claim ends it (Stopped), the hold released by the door.
        taken = door_take_out(
            ctx.deployment, name, replica, owner=ctx.hold_owner, tick=ctx.watch.check
        )
    elif how == DRAIN:
        door_drain(ctx.deployment, name, group)
    try:
        yield taken
    finally:
        if taken is not None and taken.held:
            door_release(ctx.deployment, name, group[0], owner=taken.owner)


def enter_phase(ctx: RolloutContext, steps, status: str, step_status: str) -> None:
    set_status(ctx, status)
    set_steps(steps, step_status)


def rollback_if_failed(
    ctx: RolloutContext, steps, outcomes: dict[int, ReplicaOutcome], phase: str
) -> bool:
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    if not errors:
        return False
    set_steps([s for s in steps if s.replica_id in errors], ReplicaStepStatus.FAILED, errors)
    by_pk = {r.pk: r for r in ctx.replicas}
    if phase == "load":  # a refusal may name a fact the record has wrong
        replica_load_refusals_report(ctx.deployment, {by_pk[pk]: e for pk, e in errors.items()})
    summary = "; ".join(f"{by_pk[pk].base_url}: {message}" for pk, message in errors.items())
    rollback_everywhere(ctx, f"{phase.capitalize()} failed on {len(errors)} replica(s): {summary}")
    return True


def rollback_everywhere(
    ctx: RolloutContext, reason: str, before_end: Callable[[bool], None] | None = None
) -> None:
    """Puts every replica this rollout pushed to back on the previous version,
    or unloads the adapter where nothing was served before.

    `before_end` runs just before the rollout's end is recorded, so whoever
    sees the rollout ended sees what it left too. Its argument says whether
    the replicas were tried (not when staging the old version failed first)."""
    rollout = ctx.rollout
    previous = rollout.previous_version
    name = rollout.adapter.served_name
    # A spare the swap put the adapter on goes back to not serving it.
    back_to = [r for r in ctx.replicas if r.pk not in ctx.spares]
    path = None
    if previous is not None and back_to:
        try:
            path = stage_version(ctx.deployment, previous, progress=ctx.watch.check).serve_path
        except (StagingError, OSError) as error:
            if before_end is not None:
                before_end(False)
            finish(ctx, RolloutStatus.FAILED, f"{reason}. Rollback staging failed: {error}")
            return

    def undo(client, replica):
        if path is None or replica.pk in ctx.spares:
            return ensure_unloaded(client, name, ctx.policy)
        return ensure_loaded(client, name, path, ctx.policy, known_version=replica.vllm_version)

    if back_to or not ctx.keep:
        restored = (
            f"v{previous.number}" if previous else "not loaded (there was no previous version)"
        )

        def failed(detail: str) -> str:
            return (
                f"{reason}. Rollback to {restored} failed on {detail}; reconcile will keep trying."
            )

        succeeded = f"{reason}. Every replica is back on {restored}."
    else:
        kept = ", ".join(sorted(r.base_url for r in ctx.keep))

        def failed(detail: str) -> str:
            return (
                f"{reason}. The old version still serves on {kept}; unloading the new one "
                f"failed on {detail}; reconcile will keep trying."
            )

        succeeded = (
            f"{reason}. The old version never stopped serving on {kept}; the new one was "
            "unloaded where it was tried."
        )
    if ctx.rollback_order:
        outcomes = {}
        for replica in ctx.rollback_order:
            door_drain(ctx.deployment, name, [replica])
            outcomes.update(fan_out(ctx, [replica], undo))
            if outcomes[replica.pk].ok and replica.pk not in ctx.spares:
                door_ready(ctx.deployment, name, [replica])
    else:
        outcomes = fan_out(ctx, ctx.replicas, undo)
    if before_end is not None:
        before_end(True)
    end_rollback(ctx, outcomes, failed=failed, succeeded=succeeded)


def finish(ctx: RolloutContext, status: str, error: str) -> None:
    with transaction.atomic():
        set_status(ctx, status, error=error[:10000], finished_at=timezone.now())
        audit_ended(ctx.rollout, status, error)


def audit_ended(rollout: Rollout, status: str, reason: str) -> None:
    """The audit event of a rollout the worker ended (no person acted)."""
    audit_record(
        actor=None,
        action=f"rollout.{status}",
        obj=rollout,
        department=rollout.adapter.department,
        to_state=status,
        comment=reason[:2000],
    )


def succeed(ctx: RolloutContext, served: ServedAdapter) -> None:
    rollout = ctx.rollout
    deferred = deferred_count(ctx)
    with transaction.atomic():
        set_status(ctx, RolloutStatus.SUCCEEDED, error="", finished_at=timezone.now())
        # Where the swap moved it; the replicas it left, or held back, keep the
        # old version for SERVING_ROLLBACK_RETAIN_SECONDS (a rollback is then a switch).
        placed = {"placement": served_placement_moved(served, ctx.moved)} if ctx.moved else {}
        ServedAdapter.objects.filter(pk=served.pk).update(
            version=rollout.target_version,
            served_path=rollout.served_path,
            updated_at=timezone.now(),
            # served: the row as this rollout started, its path the version before.
            kept_copy=kept_copy_record(
                served.served_path,
                [r.pk for r in ctx.keep],
                now=time.time(),
                seconds=settings.SERVING_ROLLBACK_RETAIN_SECONDS,
            ),
            **placed,
        )
        mark_unreferenced(ctx.deployment)
        served_version_changed.send(
            sender=Rollout,
            deployment=ctx.deployment,
            adapter=rollout.adapter,
            version=rollout.target_version,
        )
        # Last before the commit: the audit chain's lock is global and held until
        # then (core.audit_chain), and every promotion and rollout takes it.
        audit_record(
            actor=None,
            action="rollout.succeeded",
            obj=rollout,
            department=rollout.adapter.department,
            to_state=RolloutStatus.SUCCEEDED,
            details={
                "served_path": rollout.served_path,
                "deferred_replicas": deferred,
                # What the deployment serves from now on, chained (serving/attestation.py).
                "served": served_fact(
                    ctx.deployment.pk,
                    rollout.adapter_id,
                    rollout.target_version,
                    rollout.served_path,
                ),
            },
        )
    note_observed(
        ctx,
        rollout.adapter.served_name,
        rollout.served_path,
        only={r.pk for r in ctx.replicas if r not in ctx.keep},
    )


def deferred_count(ctx: RolloutContext) -> int:
    return sum(1 for s in ctx.steps.values() if s.status == ReplicaStepStatus.DEFERRED)


def note_observed(
    ctx: RolloutContext, name: str, root: str | None, only: set[int] | None = None
) -> None:
    """What the rollout saw each replica it pushed to serve, so the state view
    is right before the next reconcile looks again. Called after the rollout's
    outcome is committed, in a transaction of its own: every rollout of the
    deployment writes these rows, so their locks are held as briefly as possible.

    The rows are read again under a lock (in pk order, as every rollout of the
    deployment does): rollouts running at once each add their own adapter, and
    a list read at the start of the rollout would drop the others' additions.
    FOR NO KEY UPDATE, the lock an UPDATE takes: FOR UPDATE would also block the
    foreign-key checks of other rollouts' attempt inserts, which lock the
    replicas in their own order (a deadlock)."""
    ids = [r.pk for r in ctx.replicas if only is None or r.pk in only]
    with transaction.atomic():
        rows = list(
            Replica.objects.select_for_update(no_key=True).filter(pk__in=ids).order_by("pk")
        )
        for replica in rows:
            loaded = loaded_adapters(replica)
            loaded.pop(name, None)
            if root is not None:
                loaded[name] = root
            replica.loaded_adapters = as_listing(loaded)
        Replica.objects.bulk_update(rows, ["loaded_adapters"])
