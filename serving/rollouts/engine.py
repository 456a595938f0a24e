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

import logging
from dataclasses import replace

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from core.audit import audit_record
from core.state import move
from registry.storage import ObjectNotFound, StorageError
from serving.attestation import quarantine_reason
from serving.door.services import (
    door_drain,
    door_swaps_one_by_one,
    door_sync,
)
from serving.fanout import verify_with_fingerprint
from serving.models import (
    CanaryState,
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
from serving.records.leases import (
    served_adapter_claim,
    served_adapter_release,
)
from serving.records.placements import placement_targets, replica_capacity
from serving.replica_calls import (
    RetryPolicy,
    ensure_loaded,
    ensure_unloaded,
)
from serving.replica_rows import replicas_sync
from serving.rollouts.canary import canary_run, canary_verified, end_undecided
from serving.rollouts.steps import (
    LEAVE,
    TAKE_OUT,
    RolloutContext,
    Stopped,
    Watch,
    audit_ended,
    fan_out,
    finish,
    note_observed,
    set_status,
    set_steps,
    succeed,
    swap_replica,
    switch_to_kept,
)
from serving.rules.kept_copies import SwapPlan, swap_plan
from serving.rules.transitions import (
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
)
from serving.signals import served_version_changed
from serving.sync_state import loaded_adapters
from serving.volume import StagingError, mark_unreferenced, serve_path_for, stage_version

logger = logging.getLogger(__name__)


class StoreUnavailable(Exception):
    """The artifact store cannot be read right now; the rollout waits for it."""


class LeaseBusy(Exception):
    """Another worker is pushing this adapter to this deployment; retry later."""


def rollout_execute(rollout_id: int, worker: str) -> str:
    rollout = Rollout.objects.select_related(
        "deployment", "adapter__department", "target_version__adapter__department", "canary"
    ).get(pk=rollout_id)
    if rollout.status in ROLLOUT_TERMINAL:
        return rollout.status
    quarantined = quarantine_reason(rollout.deployment)
    if quarantined:
        # A rollout that came with a restored dump: nothing goes to replicas the
        # audit chain does not vouch for (serving/services/restore.py).
        with transaction.atomic():
            if move(
                rollout,
                ROLLOUT_TRANSITIONS,
                RolloutStatus.FAILED,
                error=quarantined[:10000],
                finished_at=timezone.now(),
            ):
                audit_ended(rollout, RolloutStatus.FAILED, quarantined)
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
        _run(rollout, served, Watch(rollout.pk, served.pk, worker))
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
                    audit_ended(rollout, RolloutStatus.FAILED, f"Internal error: {error}")
        raise
    finally:
        try:
            served_adapter_release(served.pk, worker)
        except DatabaseError:
            logger.warning("rollout %s: could not release the claim; it expires", rollout.pk)
    canary = getattr(rollout, "canary", None)
    if not finished:  # stopped, or left waiting: someone else may have moved it
        rollout.refresh_from_db()
    if canary is not None and rollout.status in ROLLOUT_TERMINAL:
        # Over before its canary was decided (not verified on its replica, failed).
        end_undecided(canary)
    return rollout.status


def _run(rollout: Rollout, served: ServedAdapter, watch: Watch) -> None:
    """Plan, stage, then swap the replicas in the plan's order, then finish."""
    planned = _plan(rollout, served, watch)
    if planned is None:
        return
    ctx, plan = planned
    if rollout.kind == RolloutKind.RETIRE:
        _retire(ctx)
        return
    path = _stage(ctx)
    if path is None:
        return
    name = rollout.adapter.served_name
    load, verify = _load_and_verify(ctx, name, path)
    canary = getattr(rollout, "canary", None)
    if canary is not None and canary.share is not None:
        # A traffic canary: a share of the requests, a bake, health gates.
        canary_run(ctx, served, name, load, verify)
        return
    pushed = ctx.replicas
    groups = [pushed[:1], pushed[1:]] if canary is not None and len(pushed) > 1 else [pushed]
    # Behind a front door, a version swap goes one replica at a time, as the
    # plan says (serving/rules/kept_copies.py, docs/door.md): taken out there where
    # it serves the version before, swapped, verified, put back.
    switch_after = None
    if plan is not None:
        groups = [[r] for pk in plan.order for r in pushed if r.pk == pk]
        switch_after = plan.switch_after
    # Those that hold the version already (kept copies) or never served the
    # adapter (spares) get no traffic for it: nothing to take out.
    serving_before = {
        r.pk for r in pushed if r.pk not in ctx.spares and loaded_adapters(r).get(name) != path
    }
    swapped: list[Replica] | None = [] if plan is not None else None
    for index, group in enumerate(groups):
        out = TAKE_OUT if plan is not None and group[0].pk in serving_before else LEAVE
        if not swap_replica(
            ctx, group, name, load, verify, out=out, swapped=swapped, put_back=plan is not None
        ):
            return
        if switch_after == index + 1:
            # The kept copies serve it again: the traffic leaves the others at
            # once (a rollback's switch); those not kept are swapped after.
            switch_to_kept(ctx, name, [r for r in pushed if r not in (swapped or [])])
        if index == 0 and canary is not None and canary.state == CanaryState.WAITING:
            # Verified on its replica: that was the test of a canary without a share.
            canary_verified(canary, group[0])
    _finish(ctx, served, name)


def _plan(
    rollout: Rollout, served: ServedAdapter, watch: Watch
) -> tuple[RolloutContext, SwapPlan | None] | None:
    """Which replicas the rollout pushes to, in which order, with their steps;
    None when there is nowhere to push (the rollout is then failed)."""
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
        # Only where placement puts the adapter (serving.rules.placement_plan); a retire
        # unloads it wherever it may be.
        replicas, placement = placement_targets(deployment, served, replicas)
    plan = _swap_plan(rollout, served, replicas, everyone, bounded=placement is not None)
    if plan is not None:
        # The replicas the version ends on: those given it, and those held back
        # on the version before (the reconcile swaps them once their time is up).
        ends_on = set(plan.order) | (set(plan.keep) - set(plan.moved))
        replicas = [r for r in everyone if r.pk in ends_on]
    steps = _steps_for(rollout, replicas)
    pushed = [r for r in replicas if steps[r.pk].status != ReplicaStepStatus.DEFERRED]
    policy = replace(RetryPolicy.from_settings(), sleep=watch.sleep)
    ctx = RolloutContext(rollout, deployment, pushed, steps, policy, watch)
    if plan is not None:
        by_pk = {r.pk: r for r in everyone}
        ctx.keep = [by_pk[pk] for pk in plan.keep]
        ctx.spares = plan.spares
        ctx.moved = dict(plan.moved)
    if not replicas:
        why = "The deployment has no replicas."
        if placement is not None:
            why = f"No room: no replica that is up has room for it ({placement.detail})."
        finish(ctx, RolloutStatus.FAILED, why)
        return None
    return ctx, plan


def _stage(ctx: RolloutContext) -> str | None:
    """The version's folder on the adapter volume, staged where it is not yet;
    the path the replicas load it from. None: staging failed, the rollout ended."""
    rollout, deployment = ctx.rollout, ctx.deployment
    target = rollout.target_version
    assert target is not None, f"rollout {rollout.pk} swaps in no version"
    # A resumed rollout stages again if it never recorded its folder (staging is
    # idempotent: a verified folder is reused as it is).
    if rollout.status in (RolloutStatus.PENDING, RolloutStatus.STAGING) or not rollout.served_path:
        if rollout.status in (RolloutStatus.PENDING, RolloutStatus.STAGING):
            set_status(ctx, RolloutStatus.STAGING)
        try:
            folder = stage_version(deployment, target, progress=ctx.watch.check)
        except ObjectNotFound as error:
            finish(ctx, RolloutStatus.FAILED, f"Staging failed: {error}")
            return None
        except StorageError as error:
            # The store is down, not the artifact bad: wait for it. The rollout
            # stays in staging with the reason shown; the sweeper resumes it.
            Rollout.objects.filter(pk=rollout.pk).update(
                error=f"Waiting for the artifact store: {error}"[:2000]
            )
            raise StoreUnavailable(str(error)) from error
        except (StagingError, OSError) as error:
            finish(ctx, RolloutStatus.FAILED, f"Staging failed: {error}")
            return None
        rollout.staged_path = folder.write_path
        rollout.served_path = folder.serve_path
        Rollout.objects.filter(pk=rollout.pk).update(
            staged_path=folder.write_path, served_path=folder.serve_path
        )
    return rollout.served_path or serve_path_for(deployment, target)


def _load_and_verify(ctx: RolloutContext, name: str, path: str):
    """The work each replica's thread does: load the version, then prove it serves."""

    def load(client, replica):
        return ensure_loaded(client, name, path, ctx.policy, known_version=replica.vllm_version)

    # A version fingerprinted here before (a swap back, a re-promotion) is proven
    # by matching its fingerprint, which was found unlike the base model.
    fingerprinted = VersionFingerprint.objects.filter(
        deployment=ctx.deployment, version=ctx.rollout.target_version
    ).exists()

    def verify(client, replica):
        # The fingerprint is recorded or matched after, in the replicas' order.
        return verify_with_fingerprint(
            client,
            name,
            path,
            ctx.policy,
            deployment=ctx.deployment,
            compare_base=not fingerprinted,
        )

    return load, verify


def _finish(ctx: RolloutContext, served: ServedAdapter, name: str) -> None:
    if ctx.keep:
        # Make before break: the new version serves, the old one's replicas get
        # nothing new, finish what they have, and keep the old version loaded.
        if not ctx.switched:
            door_drain(ctx.deployment, name, ctx.keep)
        retain = settings.SERVING_ROLLBACK_RETAIN_SECONDS
        held_back = [ctx.steps[r.pk] for r in ctx.keep if r.pk in ctx.steps]
        set_steps(
            held_back,
            ReplicaStepStatus.DEFERRED,
            {
                s.replica_id: f"Keeps the version before, drained, for {retain:g} s "
                "(SERVING_ROLLBACK_RETAIN_SECONDS): a rollback meanwhile is a switch of "
                "traffic. The reconcile swaps it then."
                for s in held_back
            },
        )
    succeed(ctx, served)
    door_sync(ctx.deployment, release=name)


def _traffic_canary(rollout: Rollout) -> bool:
    canary = getattr(rollout, "canary", None)
    return canary is not None and canary.share is not None


def _swap_plan(
    rollout: Rollout,
    served: ServedAdapter,
    placed: list[Replica],
    everyone: list[Replica],
    *,
    bounded: bool,
) -> SwapPlan | None:
    """The swap's plan (serving.rules.kept_copies.swap_plan) from what the records
    say, or None where the swap does not go one replica at a time (no front
    door, a retire, a traffic canary, a first load)."""
    if (
        rollout.kind == RolloutKind.RETIRE
        or _traffic_canary(rollout)
        or not placed
        or not door_swaps_one_by_one(rollout.deployment, served)
    ):
        return None
    target = rollout.target_version
    assert target is not None, f"rollout {rollout.pk} swaps in no version"
    name = rollout.adapter.served_name
    resumed = set(ReplicaRollout.objects.filter(rollout=rollout).values_list("replica", flat=True))
    capacity = replica_capacity(rollout.deployment)
    # Each listing, read once (parsed from the recorded /v1/models); a replica
    # that is down serves nothing, whatever it listed before.
    up = [r.pk for r in everyone if r.health != ReplicaHealth.DOWN]
    loaded = {r.pk: loaded_adapters(r) if r.pk in up else {} for r in everyone}
    return swap_plan(
        [r.pk for r in placed],
        up,
        loaded=loaded,
        name=name,
        path=rollout.served_path or serve_path_for(rollout.deployment, target),
        before=served.served_path,
        room={pk for pk in up if name in loaded[pk] or len(loaded[pk]) < capacity},
        resumed=resumed,
        spares=bounded and getattr(rollout, "canary", None) is None,
        keep=settings.SERVING_ROLLBACK_RETAIN_SECONDS > 0,
        rollback=rollout.kind == RolloutKind.ROLLBACK,
    )


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


def _retire(ctx: RolloutContext) -> None:
    name = ctx.rollout.adapter.served_name
    pushed = [ctx.steps[r.pk] for r in ctx.replicas]
    set_status(ctx, RolloutStatus.LOADING)
    set_steps(pushed, ReplicaStepStatus.LOADING)
    # The front door answers 404 for it from now on (no route), and the requests
    # in flight finish before the adapter goes.
    door_sync(ctx.deployment, release=name)
    door_drain(ctx.deployment, name, ctx.replicas, keep_one=False)
    outcomes = fan_out(
        ctx, ctx.replicas, lambda client, r: ensure_unloaded(client, name, ctx.policy)
    )
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    set_steps([s for s in pushed if s.replica_id not in errors], ReplicaStepStatus.SUCCEEDED)
    set_steps([s for s in pushed if s.replica_id in errors], ReplicaStepStatus.FAILED, errors)
    with transaction.atomic():
        if errors:
            set_status(
                ctx,
                RolloutStatus.FAILED,
                error="Unload failed on some replicas; reconcile will retry: "
                + "; ".join(errors.values()),
                finished_at=timezone.now(),
            )
        else:
            set_status(ctx, RolloutStatus.SUCCEEDED, finished_at=timezone.now())
        mark_unreferenced(ctx.deployment)
        served_version_changed.send(
            sender=Rollout, deployment=ctx.deployment, adapter=ctx.rollout.adapter, version=None
        )
        # Last before the commit, as in succeed: the audit chain's lock is global.
        status = RolloutStatus.FAILED if errors else RolloutStatus.SUCCEEDED
        audit_record(
            actor=None,
            action=f"rollout.{status}",
            obj=ctx.rollout,
            department=ctx.rollout.adapter.department,
            to_state=status,
            details={"kind": RolloutKind.RETIRE, "failed_replicas": len(errors)},
        )
    note_observed(ctx, name, None, only={r.pk for r in ctx.replicas if r.pk not in errors})
    door_sync(ctx.deployment, release=name)
