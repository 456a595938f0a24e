"""The rollout engine: stage the artifact on the adapter volume, load it into every
replica in parallel, verify each one, and roll everything back if any fails.

Run by the `serving.run_rollout` Celery task. Every step is idempotent: a
redelivered or swept task resumes a rollout, finds what is already staged or
loaded, and carries on.

The worker holds a short claim on the (deployment, adapter) for as long as it
works, renewed by a heartbeat between phases, between staging chunks and while
it waits for the replicas' threads (which sleep through their back-off but
never touch the database). Every status change is a compare-and-swap on the
status the worker last saw: if it fails, someone else moved the rollout (a
person cancelled it, or the claim expired and another worker resumed it), and
this worker stops without writing anything more.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from core.audit import audit_record
from core.claims import LeaseLost
from core.state import move
from registry.storage import ObjectNotFound, StorageError
from serving.attestation import refusal, served_fact
from serving.fanout import on_replicas, verify_with_fingerprint
from serving.gateway.services import (
    gateway_drain,
    gateway_ready,
    gateway_release,
    gateway_swaps_one_by_one,
    gateway_sync,
    gateway_take_out,
)
from serving.models import (
    Deployment,
    Replica,
    ReplicaHealth,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
    VersionFingerprint,
)
from serving.replica_calls import (
    ReplicaOutcome,
    RetryPolicy,
    RetryStopped,
    ensure_loaded,
    ensure_unloaded,
)
from serving.replica_rows import replicas_sync
from serving.retention import retained_for
from serving.services.attempts import attempts_record_all
from serving.services.fingerprints import fingerprints_check_rollout
from serving.services.leases import (
    claim_seconds,
    served_adapter_claim,
    served_adapter_heartbeat,
    served_adapter_release,
)
from serving.services.placements import (
    placement_targets,
    served_placement_moved,
    swap_spares,
)
from serving.services.reported_facts import replica_load_refusals_report
from serving.signals import served_version_changed
from serving.sync_state import as_listing, loaded_adapters
from serving.transitions import (
    REPLICA_STEP_TRANSITIONS,
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
)
from serving.volume import StagingError, mark_unreferenced, serve_path_for, stage_version

logger = logging.getLogger(__name__)


class StoreUnavailable(Exception):
    """The artifact store cannot be read right now; the rollout waits for it."""


class LeaseBusy(Exception):
    """Another worker is pushing this adapter to this deployment; retry later."""


class Stopped(Exception):
    """This worker must stop: the rollout was cancelled, or another worker holds it now."""


class _Watch:
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


def _set_status(ctx: _Context, status: str, **fields) -> None:
    """Compare-and-swap from the status this worker last saw."""
    ctx.watch.check()
    if not move(ctx.rollout, ROLLOUT_TRANSITIONS, status, **fields):
        now = Rollout.objects.filter(pk=ctx.rollout.pk).values_list("status", flat=True).first()
        raise Stopped(f"the rollout is {now} now, not {ctx.rollout.status}")


def _set_steps(steps: list[ReplicaRollout], status: str, errors: dict[int, str] | None = None):
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
class _Context:
    rollout: Rollout
    deployment: Deployment
    replicas: list[Replica]  # the ones this rollout pushes to (deferred ones are not)
    steps: dict[int, ReplicaRollout]
    policy: RetryPolicy
    watch: _Watch
    # Behind a front door, the order a rollback goes through the replicas one
    # at a time, each drained there first (make before break); None: all at once.
    rollback_order: list[Replica] | None = None
    # A swap made on spare replicas (swap_spares): per replica pushed to, the
    # replica whose traffic it takes, which keeps the old version, drained.
    moves: dict[int, Replica] = field(default_factory=dict)
    moved: list[Replica] = field(default_factory=list)  # those that took it so far
    # An in-place swap behind a front door: the replica left on the old version,
    # drained, for SERVING_ROLLBACK_RETAIN_SECONDS (a rollback's switch), then
    # swapped by the reconcile.
    kept: Replica | None = None
    # Names this worker's holds at the front door (only its own are released):
    # a worker that resumes the rollout after a lost claim holds under its own.
    hold_owner: str = field(default_factory=lambda: secrets.token_hex(8))


def _fan_out(ctx: _Context, replicas: list[Replica], work) -> dict[int, ReplicaOutcome]:
    """Runs `work(client, replica)` on every replica at once (serving.fanout);
    records attempts after."""
    results = on_replicas(
        ctx.deployment, replicas, work, tick=ctx.watch.tick, interval=ctx.watch.interval
    )
    outcomes = {r.pk: outcome for r, outcome in zip(replicas, results, strict=True)}
    attempts_record_all([(r, outcomes[r.pk], ctx.steps.get(r.pk)) for r in replicas])
    for replica in replicas:
        outcome = outcomes[replica.pk]
        if outcome.vllm_version and outcome.vllm_version != replica.vllm_version:
            replica.vllm_version = outcome.vllm_version
            Replica.objects.filter(pk=replica.pk).update(vllm_version=outcome.vllm_version)
    ctx.watch.raise_if_stopped()
    return outcomes


def rollout_execute(rollout_id: int, worker: str) -> str:
    rollout = Rollout.objects.select_related(
        "deployment", "adapter__department", "target_version__adapter__department"
    ).get(pk=rollout_id)
    if rollout.status in ROLLOUT_TERMINAL:
        return rollout.status
    held = refusal(rollout.deployment)
    if held:
        # A rollout that came with a restored dump: nothing goes to replicas the
        # audit chain does not vouch for (serving/services/restore.py).
        with transaction.atomic():
            if move(
                rollout,
                ROLLOUT_TRANSITIONS,
                RolloutStatus.FAILED,
                error=held[:10000],
                finished_at=timezone.now(),
            ):
                _audit_ended(rollout, RolloutStatus.FAILED, held)
        return rollout.status
    served, _ = ServedAdapter.objects.get_or_create(
        deployment=rollout.deployment, adapter=rollout.adapter
    )
    if not served_adapter_claim(served.pk, worker):
        raise LeaseBusy(
            f"{rollout.adapter} on {rollout.deployment} is being pushed by another worker"
        )
    finished = False
    try:
        served.refresh_from_db()
        _run(rollout, served, _Watch(rollout.pk, served.pk, worker))
        # Every status it reached was a compare-and-swap on this instance: what it
        # holds is what the row says (one SELECT less on the critical path).
        finished = rollout.status in ROLLOUT_TERMINAL
    except Stopped as stop:
        logger.warning("rollout %s: stopped (%s)", rollout.pk, stop)
    except DatabaseError:
        # The database went away mid-rollout: nothing can be recorded now. The
        # claim expires, and the sweeper resumes the rollout from its last state.
        logger.exception("rollout %s: database error; the sweeper will resume it", rollout.pk)
        raise
    except StoreUnavailable as error:
        logger.warning(
            "rollout %s: artifact store down (%s); the sweeper resumes it", rollout.pk, error
        )
    except Exception as error:  # record, then let the task see it
        logger.exception("rollout %s crashed", rollout.pk)
        rollout.refresh_from_db()
        if rollout.status not in ROLLOUT_TERMINAL:
            with transaction.atomic():
                failed = move(
                    rollout,
                    ROLLOUT_TRANSITIONS,
                    RolloutStatus.FAILED,
                    error=f"Internal error: {error}"[:10000],
                    finished_at=timezone.now(),
                )
                if failed:
                    # A crash is a failure like any other: it is audited, and no
                    # replica step is left looking as if it were still running.
                    ReplicaRollout.objects.filter(
                        rollout=rollout,
                        status__in=[
                            ReplicaStepStatus.PENDING,
                            ReplicaStepStatus.LOADING,
                            ReplicaStepStatus.VERIFYING,
                        ],
                    ).update(status=ReplicaStepStatus.FAILED, error="The rollout crashed.")
                    _audit_ended(rollout, RolloutStatus.FAILED, f"Internal error: {error}")
        raise
    finally:
        try:
            served_adapter_release(served.pk, worker)
        except DatabaseError:
            logger.warning("rollout %s: could not release the claim; it expires", rollout.pk)
    if not finished:  # stopped, or left waiting: someone else may have moved it
        rollout.refresh_from_db()
    return rollout.status


def _run(rollout: Rollout, served: ServedAdapter, watch: _Watch) -> None:
    deployment = rollout.deployment
    if rollout.started_at is None:
        # The previous version is what was serving when this rollout actually started.
        rollout.previous_version = served.version if rollout.kind != RolloutKind.RETIRE else None
        rollout.started_at = timezone.now()
        Rollout.objects.filter(pk=rollout.pk).update(
            previous_version=rollout.previous_version, started_at=rollout.started_at
        )
    # By URL, as the page lists them: the canary is the first, whatever order
    # discovery returned.
    replicas = sorted(replicas_sync(deployment), key=lambda r: r.base_url)
    everyone = replicas
    placement = None
    if rollout.kind != RolloutKind.RETIRE and replicas:
        # Only where placement puts the adapter (serving.placement); a retire
        # unloads it wherever it may be.
        replicas, placement = placement_targets(deployment, served, replicas)
    moves = _moves_for(rollout, served, replicas, everyone) if placement is not None else {}
    if moves:
        replicas = [r for r in everyone if r.pk in moves]
    steps = _steps_for(rollout, replicas)
    pushed = [r for r in replicas if steps[r.pk].status != ReplicaStepStatus.DEFERRED]
    policy = replace(RetryPolicy.from_settings(), sleep=watch.sleep)
    ctx = _Context(rollout, deployment, pushed, steps, policy, watch, moves=moves)
    if not replicas:
        why = "The deployment has no replicas."
        if placement is not None:
            why = f"No room: no replica that is up has room for it ({placement.detail})."
        _finish(ctx, RolloutStatus.FAILED, why)
        return
    if rollout.kind == RolloutKind.RETIRE:
        _retire(ctx)
        return

    target = rollout.target_version
    assert target is not None, f"rollout {rollout.pk} swaps in no version"
    # A resumed rollout stages again if it never recorded its folder (staging is
    # idempotent: a verified folder is reused as it is).
    if rollout.status in (RolloutStatus.PENDING, RolloutStatus.STAGING) or not rollout.served_path:
        if rollout.status in (RolloutStatus.PENDING, RolloutStatus.STAGING):
            _set_status(ctx, RolloutStatus.STAGING)
        try:
            folder = stage_version(deployment, target, progress=watch.check)
        except ObjectNotFound as error:
            _finish(ctx, RolloutStatus.FAILED, f"Staging failed: {error}")
            return
        except StorageError as error:
            # The store is down, not the artifact bad: wait for it. The rollout
            # stays in staging with the reason shown; the sweeper resumes it.
            Rollout.objects.filter(pk=rollout.pk).update(
                error=f"Waiting for the artifact store: {error}"[:2000]
            )
            raise StoreUnavailable(str(error)) from error
        except (StagingError, OSError) as error:
            _finish(ctx, RolloutStatus.FAILED, f"Staging failed: {error}")
            return
        rollout.staged_path = folder.write_path
        rollout.served_path = folder.serve_path
        Rollout.objects.filter(pk=rollout.pk).update(
            staged_path=folder.write_path, served_path=folder.serve_path
        )
    path = rollout.served_path or serve_path_for(deployment, target)
    name = rollout.adapter.served_name

    def load(client, replica):
        return ensure_loaded(client, name, path, ctx.policy, known_version=replica.vllm_version)

    # A version fingerprinted here before (a swap back, a re-promotion) is proven
    # by matching its fingerprint, which was found unlike the base model.
    fingerprinted = VersionFingerprint.objects.filter(
        deployment=deployment, version=target
    ).exists()

    def verify(client, replica):
        # The fingerprint is recorded or matched after, in the replicas' order.
        return verify_with_fingerprint(
            client, name, path, ctx.policy, deployment=deployment, compare_base=not fingerprinted
        )

    if rollout.canary_share:
        # A traffic canary: a share of the requests, a bake, health gates.
        from serving.services.canary import canary_run

        canary_run(ctx, served, name, load, verify)
        return
    groups = [pushed[:1], pushed[1:]] if rollout.canary and len(pushed) > 1 else [pushed]
    # Behind a front door, a version swap goes one replica at a time: drained
    # there, swapped, verified, put back (serving/gateway/, docs/gateway.md).
    swap = gateway_swaps_one_by_one(deployment, served)
    switch_after = None
    if swap:
        order = pushed
        if not ctx.moves:
            order, switch_after = _swap_order(ctx, name, path, served.served_path)
        groups = [[replica] for replica in order]
    swapped: list[Replica] = []
    for index, group in enumerate(groups):
        group_steps = [steps[r.pk] for r in group]
        _phase(ctx, group_steps, RolloutStatus.LOADING, ReplicaStepStatus.LOADING)
        # (Those that kept the version get no traffic for it: nothing to take out.)
        take_out = swap and not ctx.moves and index >= (switch_after or 0)
        with _taken_out(ctx, name, group, take_out) as taken:
            if taken is not None and taken.busy:
                # Never unloaded under requests it still runs (SERVING_GATEWAY_DRAIN_SECONDS).
                loaded = {
                    r.pk: ReplicaOutcome().fail(
                        f"{taken.busy} request(s) through {name} were still running there "
                        f"after {settings.SERVING_GATEWAY_DRAIN_SECONDS:g} s "
                        "(SERVING_GATEWAY_DRAIN_SECONDS); not swapped while they run."
                    )
                    for r in group
                }
            else:
                loaded = _fan_out(ctx, group, load)
            if swap and not ctx.moves and not all(o.ok for o in loaded.values()):
                _switch_back(ctx, name, group, swapped)
            phase = "drain" if taken is not None and taken.busy else "load"
            if _failed(ctx, group_steps, loaded, phase):
                gateway_sync(deployment, release=name)
                return
            _phase(ctx, group_steps, RolloutStatus.VERIFYING, ReplicaStepStatus.VERIFYING)
            verified = _fan_out(ctx, group, verify)
            fingerprints_check_rollout(rollout=rollout, replicas=group, outcomes=verified)
            if swap and not ctx.moves and not all(o.ok for o in verified.values()):
                _switch_back(ctx, name, group, swapped)
            if _failed(ctx, group_steps, verified, "verification"):
                gateway_sync(deployment, release=name)
                return
            if swap:
                gateway_ready(deployment, name, group)
                swapped += group
        if ctx.moves:
            # The new version serves there: the old one's replica gets nothing
            # new, finishes what it has, and keeps the old version loaded.
            ctx.moved += group
            gateway_drain(deployment, name, [ctx.moves[r.pk] for r in group])
        if switch_after == index + 1:
            # The replicas that kept this version serve it again: the traffic
            # leaves the others at once (a rollback's switch); they are swapped after.
            gateway_drain(deployment, name, [r for r in pushed if r not in swapped])
        _set_steps(group_steps, ReplicaStepStatus.SUCCEEDED)
    if ctx.kept is not None:
        gateway_drain(deployment, name, [ctx.kept])
        retain = settings.SERVING_ROLLBACK_RETAIN_SECONDS
        _set_steps(
            [steps[ctx.kept.pk]],
            ReplicaStepStatus.DEFERRED,
            {
                ctx.kept.pk: f"Keeps the version before, drained, for {retain:g} s "
                "(SERVING_ROLLBACK_RETAIN_SECONDS): a rollback meanwhile is a switch of "
                "traffic. The reconcile swaps it then."
            },
        )
    _succeed(ctx, served)
    gateway_sync(deployment, release=name)


@contextlib.contextmanager
def _taken_out(ctx: _Context, name: str, group: list[Replica], take: bool):
    """With `take`, the swap's replica (a group of one) taken out at the front
    door for the block (gateway_take_out): drained, or, where it is the only
    one serving `name`, `name`'s new requests held at the door. The hold ends
    when the block does, whichever way: after the replica is back, or after a
    failure's switch back and rollback. A worker that dies meanwhile leaves a
    hold that its deadline ends (door.lua) and the next sync removes."""
    taken = None
    if take:
        [replica] = group
        # The wait for its requests in flight renews the claim; a cancel or a
        # lost claim ends it (Stopped), the hold released by the door.
        taken = gateway_take_out(
            ctx.deployment, name, replica, owner=ctx.hold_owner, tick=ctx.watch.check
        )
    try:
        yield taken
    finally:
        if taken is not None and taken.held:
            gateway_release(ctx.deployment, name, replica, owner=taken.owner)


def _swap_order(
    ctx: _Context, name: str, path: str, before: str | None
) -> tuple[list[Replica], int | None]:
    """The order an in-place swap goes through the replicas, one at a time, and
    after how many the others are drained at once (None: never). Replicas that
    already hold the version at `path` (a retained copy: a rollback) go first,
    then the traffic leaves the others at once. Otherwise, with a retention set
    and two replicas or more, the last one serving the version before (at
    `before`) is not swapped: it keeps it, drained (ctx.kept)."""
    pushed = ctx.replicas
    holding = [r for r in pushed if loaded_adapters(r).get(name) == path]
    others = [r for r in pushed if r not in holding]
    if holding and others:
        return holding + others, len(holding)
    serving_before = [r for r in pushed if before and loaded_adapters(r).get(name) == before]
    if (
        not holding
        and len(pushed) >= 2
        and serving_before
        and ctx.rollout.kind != RolloutKind.ROLLBACK
        and settings.SERVING_ROLLBACK_RETAIN_SECONDS > 0
    ):
        ctx.kept = serving_before[-1]
        return [r for r in pushed if r is not ctx.kept], None
    return pushed, None


def _moves_for(
    rollout: Rollout, served: ServedAdapter, placed: list[Replica], everyone: list[Replica]
) -> dict[int, Replica]:
    """Make before break for a version swap of an adapter placement holds on
    fewer replicas than the deployment has: {spare replica id: the placed
    replica whose traffic it takes} (swap_spares), or {} where it cannot (a
    first load, a canary, no front door, not enough room): in place, one by one."""
    if (
        rollout.canary
        or rollout.canary_share
        or not gateway_swaps_one_by_one(rollout.deployment, served)
    ):
        return {}
    resumed = set(ReplicaRollout.objects.filter(rollout=rollout).values_list("replica", flat=True))
    target = rollout.target_version
    assert target is not None, f"rollout {rollout.pk} swaps in no version"
    path = rollout.served_path or serve_path_for(rollout.deployment, target)
    spares = swap_spares(rollout.deployment, served, placed, everyone, path=path, resumed=resumed)
    return {spare.pk: old for spare, old in zip(spares or [], placed, strict=False)}


def _move_back(ctx: _Context, reason: str) -> None:
    """A swap made on spare replicas failed: the replicas that kept the old
    version get its traffic back (the runtime API: milliseconds, no reload),
    then the new version leaves the spares, drained first."""
    name = ctx.rollout.adapter.served_name
    gateway_ready(ctx.deployment, name, [ctx.moves[r.pk] for r in ctx.moved])
    gateway_drain(ctx.deployment, name, ctx.moved)
    outcomes = _fan_out(
        ctx, ctx.replicas, lambda client, replica: ensure_unloaded(client, name, ctx.policy)
    )
    kept = ", ".join(sorted(old.base_url for old in ctx.moves.values()))
    _end_rollback(
        ctx,
        outcomes,
        failed=lambda detail: (
            f"{reason}. The old version still serves on {kept}; unloading the new one "
            f"failed on {detail}; reconcile will keep trying."
        ),
        succeeded=(
            f"{reason}. The old version never stopped serving on {kept}; the new one was "
            "unloaded where it was tried."
        ),
    )


def _end_rollback(
    ctx: _Context,
    outcomes: dict[int, ReplicaOutcome],
    *,
    failed: Callable[[str], str],
    succeeded: str,
) -> None:
    """Marks the steps that were undone, then ends the rollout: FAILED, naming
    each replica where undoing failed (the reconcile keeps trying), else ROLLED_BACK."""
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    _set_steps(
        [s for pk, s in ctx.steps.items() if pk not in errors], ReplicaStepStatus.ROLLED_BACK
    )
    if errors:
        by_url = {r.pk: r.base_url for r in ctx.replicas}
        detail = "; ".join(f"{by_url[pk]}: {m}" for pk, m in errors.items())
        _finish(ctx, RolloutStatus.FAILED, failed(detail))
        return
    _finish(ctx, RolloutStatus.ROLLED_BACK, succeeded)


def _switch_back(ctx: _Context, name: str, failed: list[Replica], swapped: list[Replica]):
    """A swap failed on `failed`: traffic leaves the replicas already on the new
    version at once (the runtime API, milliseconds) wherever a replica not yet
    swapped still serves the old one; then the rollback goes one replica at a
    time, the failed one first, so that one always serves."""
    gateway_drain(ctx.deployment, name, swapped)
    rest = [r for r in ctx.replicas if r not in failed and r not in swapped]
    ctx.rollback_order = [*failed, *swapped, *rest]


def _phase(ctx: _Context, steps, status: str, step_status: str) -> None:
    _set_status(ctx, status)
    _set_steps(steps, step_status)


def _steps_for(rollout: Rollout, replicas: list[Replica]) -> dict[int, ReplicaRollout]:
    """One row per replica; a resumed rollout finds the rows it made before.

    A replica that was already marked down when the rollout starts is deferred
    (not pushed to: waiting out its retry deadline would hold up every other
    replica), unless the deployment requires every replica or none is up.
    """
    existing = ReplicaRollout.objects.filter(rollout=rollout, replica__in=replicas)
    steps = {step.replica_id: step for step in existing}
    new = [r for r in replicas if r.pk not in steps]
    if new:
        defer = not rollout.deployment.require_all_replicas and any(
            r.health != ReplicaHealth.DOWN for r in replicas
        )

        missing = []
        for replica in new:
            step = ReplicaRollout(rollout=rollout, replica=replica)
            if defer and replica.health == ReplicaHealth.DOWN:
                step.status = ReplicaStepStatus.DEFERRED
                step.error = f"Down at the start: {replica.last_error}"[:2000]
            missing.append(step)
        # ignore_conflicts: the (rollout, replica) constraint still holds if another
        # delivery of this task got there first. Rows are read back for their ids.
        ReplicaRollout.objects.bulk_create(missing, ignore_conflicts=True)
        steps = {step.replica_id: step for step in existing.all()}
    return steps


def _failed(ctx: _Context, steps, outcomes: dict[int, ReplicaOutcome], phase: str) -> bool:
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    if not errors:
        return False
    _set_steps([s for s in steps if s.replica_id in errors], ReplicaStepStatus.FAILED, errors)
    by_pk = {r.pk: r for r in ctx.replicas}
    if phase == "load":  # a refusal may name a fact the record has wrong
        replica_load_refusals_report(ctx.deployment, {by_pk[pk]: e for pk, e in errors.items()})
    summary = "; ".join(f"{by_pk[pk].base_url}: {message}" for pk, message in errors.items())
    _rollback_everywhere(ctx, f"{phase.capitalize()} failed on {len(errors)} replica(s): {summary}")
    return True


def _rollback_everywhere(ctx: _Context, reason: str) -> None:
    """Puts every replica this rollout pushed to back on the previous version,
    or unloads the adapter where nothing was served before."""
    if ctx.moves:
        _move_back(ctx, reason)
        return
    rollout = ctx.rollout
    previous = rollout.previous_version
    name = rollout.adapter.served_name
    if previous is not None:
        try:
            folder = stage_version(ctx.deployment, previous, progress=ctx.watch.check)
        except (StagingError, OSError) as error:
            _finish(ctx, RolloutStatus.FAILED, f"{reason}. Rollback staging failed: {error}")
            return

        def load_previous(client, replica):
            return ensure_loaded(
                client, name, folder.serve_path, ctx.policy, known_version=replica.vllm_version
            )

        if ctx.rollback_order:
            outcomes = {}
            for replica in ctx.rollback_order:
                gateway_drain(ctx.deployment, name, [replica])
                outcomes.update(_fan_out(ctx, [replica], load_previous))
                if outcomes[replica.pk].ok:
                    gateway_ready(ctx.deployment, name, [replica])
        else:
            outcomes = _fan_out(ctx, ctx.replicas, load_previous)
        restored = f"v{previous.number}"
    else:
        outcomes = _fan_out(
            ctx, ctx.replicas, lambda client, replica: ensure_unloaded(client, name, ctx.policy)
        )
        restored = "not loaded (there was no previous version)"
    _end_rollback(
        ctx,
        outcomes,
        failed=lambda detail: (
            f"{reason}. Rollback to {restored} failed on {detail}; reconcile will keep trying."
        ),
        succeeded=f"{reason}. Every replica is back on {restored}.",
    )


def _finish(ctx: _Context, status: str, error: str) -> None:
    with transaction.atomic():
        _set_status(ctx, status, error=error[:10000], finished_at=timezone.now())
        _audit_ended(ctx.rollout, status, error)


def _audit_ended(rollout: Rollout, status: str, reason: str) -> None:
    """The audit event of a rollout the worker ended (no person acted)."""
    audit_record(
        actor=None,
        action=f"rollout.{status}",
        obj=rollout,
        department=rollout.adapter.department,
        to_state=status,
        comment=reason[:2000],
    )


def _succeed(ctx: _Context, served: ServedAdapter) -> None:
    rollout = ctx.rollout
    deferred = _deferred_count(ctx)
    with transaction.atomic():
        _set_status(ctx, RolloutStatus.SUCCEEDED, error="", finished_at=timezone.now())
        placed = {}
        left = [ctx.kept.pk] if ctx.kept is not None else []
        if ctx.moves:
            # Where the swap moved it; the replicas it left keep the old version
            # for SERVING_ROLLBACK_RETAIN_SECONDS (a rollback is then a switch).
            moved = {old.pk: spare for spare, old in ctx.moves.items()}
            placed["placement"] = served_placement_moved(served, moved)
            left = [old.pk for old in ctx.moves.values()]
        ServedAdapter.objects.filter(pk=served.pk).update(
            version=rollout.target_version,
            served_path=rollout.served_path,
            updated_at=timezone.now(),
            # served: the row as this rollout started, its path the version before.
            retained=retained_for(
                served.served_path,
                left,
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
    _note_observed(
        ctx,
        rollout.adapter.served_name,
        rollout.served_path,
        only={r.pk for r in ctx.replicas if r is not ctx.kept},
    )


def _deferred_count(ctx: _Context) -> int:
    return sum(1 for s in ctx.steps.values() if s.status == ReplicaStepStatus.DEFERRED)


def _note_observed(
    ctx: _Context, name: str, root: str | None, only: set[int] | None = None
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


def _retire(ctx: _Context) -> None:
    name = ctx.rollout.adapter.served_name
    pushed = [ctx.steps[r.pk] for r in ctx.replicas]
    _set_status(ctx, RolloutStatus.LOADING)
    _set_steps(pushed, ReplicaStepStatus.LOADING)
    # The front door answers 404 for it from now on (no route), and the requests
    # in flight finish before the adapter goes.
    gateway_sync(ctx.deployment, release=name)
    gateway_drain(ctx.deployment, name, ctx.replicas, keep_one=False)
    outcomes = _fan_out(
        ctx, ctx.replicas, lambda client, r: ensure_unloaded(client, name, ctx.policy)
    )
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    _set_steps([s for s in pushed if s.replica_id not in errors], ReplicaStepStatus.SUCCEEDED)
    _set_steps([s for s in pushed if s.replica_id in errors], ReplicaStepStatus.FAILED, errors)
    with transaction.atomic():
        if errors:
            _set_status(
                ctx,
                RolloutStatus.FAILED,
                error="Unload failed on some replicas; reconcile will retry: "
                + "; ".join(errors.values()),
                finished_at=timezone.now(),
            )
        else:
            _set_status(ctx, RolloutStatus.SUCCEEDED, finished_at=timezone.now())
        mark_unreferenced(ctx.deployment)
        served_version_changed.send(
            sender=Rollout, deployment=ctx.deployment, adapter=ctx.rollout.adapter, version=None
        )
        # Last before the commit, as in _succeed: the audit chain's lock is global.
        status = RolloutStatus.FAILED if errors else RolloutStatus.SUCCEEDED
        audit_record(
            actor=None,
            action=f"rollout.{status}",
            obj=ctx.rollout,
            department=ctx.rollout.adapter.department,
            to_state=status,
            details={"kind": RolloutKind.RETIRE, "failed_replicas": len(errors)},
        )
    _note_observed(ctx, name, None, only={r.pk for r in ctx.replicas if r.pk not in errors})
    gateway_sync(ctx.deployment, release=name)
