"""Rollouts: stage the artifact on the adapter volume, load it into every
replica in parallel, verify each one, and roll everything back if any fails.

Run by the `serving.run_rollout` Celery task. Every step is idempotent: a
redelivered task resumes a rollout, finds what is already staged or loaded,
and carries on.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict
from core.state import can_move
from registry.models import AdapterVersion
from serving.models import (
    Deployment,
    Replica,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.replica_ops import (
    ReplicaOutcome,
    RetryPolicy,
    ensure_loaded,
    ensure_unloaded,
    verify_serving,
)
from serving.replicas import client_for, replicas_sync
from serving.services.attempts import attempts_record_all
from serving.services.leases import served_adapter_claim, served_adapter_release
from serving.signals import served_version_changed
from serving.transitions import (
    REPLICA_STEP_TRANSITIONS,
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
)
from serving.volume import StagingError, mark_unreferenced, serve_path_for, stage_version

logger = logging.getLogger(__name__)


class LeaseBusy(Exception):
    """Another worker is pushing this adapter to this deployment; retry later."""


def rollout_create(
    *,
    actor: Actor | None,
    deployment: Deployment,
    adapter,
    target: AdapterVersion | None,
    kind: str,
    canary: bool = False,
    promotion=None,
) -> Rollout:
    """Records the rollout and enqueues it after commit. Call inside a transaction."""
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=adapter,
        kind=kind,
        target_version=target,
        canary=canary,
        promotion=promotion,
        requested_by=actor.user if actor else None,
    )
    audit_record(
        actor=actor,
        action=f"rollout.{kind}",
        obj=rollout,
        department=adapter.department,
        to_state=rollout.status,
        details={
            "deployment": deployment.name,
            "target_version": target.number if target else None,
            "canary": canary,
        },
    )
    transaction.on_commit(lambda: _enqueue(rollout.pk))
    return rollout


def _enqueue(rollout_id: int) -> None:
    from serving.tasks import run_rollout

    run_rollout.delay(rollout_id)


def _set_status(rollout: Rollout, status: str, **fields) -> None:
    if not can_move(ROLLOUT_TRANSITIONS, rollout.status, status):
        raise Conflict(f"Rollout {rollout.pk} cannot go from {rollout.status} to {status}.")
    rollout.status = status
    for name, value in fields.items():
        setattr(rollout, name, value)
    Rollout.objects.filter(pk=rollout.pk).update(status=status, **fields)


def _set_steps(steps: list[ReplicaRollout], status: str, errors: dict[int, str] | None = None):
    # One UPDATE per distinct error message (usually one for every replica): each
    # statement is a round trip on the rollout's critical path.
    by_error: dict[str, list[int]] = {}
    for step in steps:
        if not can_move(REPLICA_STEP_TRANSITIONS, step.status, status):
            continue
        step.status = status
        # A failed step keeps its reason when it is then rolled back.
        keep = status in (ReplicaStepStatus.FAILED, ReplicaStepStatus.ROLLED_BACK)
        step.error = (errors or {}).get(step.replica_id, step.error if keep else "")
        by_error.setdefault(step.error, []).append(step.pk)
    for error, pks in by_error.items():
        ReplicaRollout.objects.filter(pk__in=pks).update(status=status, error=error)


@dataclass
class _Context:
    rollout: Rollout
    deployment: Deployment
    replicas: list[Replica]
    steps: dict[int, ReplicaRollout]
    policy: RetryPolicy


def _fan_out(ctx: _Context, replicas: list[Replica], work) -> dict[int, ReplicaOutcome]:
    """Runs `work(client, replica)` on every replica at once; records attempts after."""

    def run(replica: Replica) -> ReplicaOutcome:
        with client_for(replica, ctx.deployment) as client:
            return work(client, replica)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(replicas)))) as pool:
        outcomes = dict(zip([r.pk for r in replicas], pool.map(run, replicas), strict=True))
    attempts_record_all([(r, outcomes[r.pk], ctx.steps.get(r.pk)) for r in replicas])
    for replica in replicas:
        outcome = outcomes[replica.pk]
        if outcome.vllm_version and outcome.vllm_version != replica.vllm_version:
            replica.vllm_version = outcome.vllm_version
            Replica.objects.filter(pk=replica.pk).update(vllm_version=outcome.vllm_version)
    return outcomes


def rollout_execute(rollout_id: int, worker: str) -> str:
    rollout = Rollout.objects.select_related(
        "deployment", "adapter__department", "target_version__adapter__department"
    ).get(pk=rollout_id)
    if rollout.status in ROLLOUT_TERMINAL:
        return rollout.status
    served, _ = ServedAdapter.objects.get_or_create(
        deployment=rollout.deployment, adapter=rollout.adapter
    )
    if not served_adapter_claim(served.pk, worker):
        raise LeaseBusy(
            f"{rollout.adapter} on {rollout.deployment} is being pushed by another worker"
        )
    try:
        served.refresh_from_db()
        _run(rollout, served)
    except Exception as error:  # record, then let the task see it
        logger.exception("rollout %s crashed", rollout.pk)
        rollout.refresh_from_db()
        if rollout.status not in ROLLOUT_TERMINAL:
            _set_status(
                rollout,
                RolloutStatus.FAILED,
                error=f"Internal error: {error}",
                finished_at=timezone.now(),
            )
        raise
    finally:
        served_adapter_release(served.pk, worker)
    return rollout.status


def _run(rollout: Rollout, served: ServedAdapter) -> None:
    deployment = rollout.deployment
    if rollout.started_at is None:
        # The previous version is what was serving when this rollout actually started.
        rollout.previous_version = served.version if rollout.kind != RolloutKind.RETIRE else None
        rollout.started_at = timezone.now()
        Rollout.objects.filter(pk=rollout.pk).update(
            previous_version=rollout.previous_version, started_at=rollout.started_at
        )
    replicas = replicas_sync(deployment)
    steps = _steps_for(rollout, replicas)
    ctx = _Context(rollout, deployment, replicas, steps, RetryPolicy.from_settings())
    if not replicas:
        _finish(ctx, RolloutStatus.FAILED, "The deployment has no replicas.")
        return
    if rollout.kind == RolloutKind.RETIRE:
        _retire(ctx, served)
        return

    target = rollout.target_version
    if rollout.status in (RolloutStatus.PENDING, RolloutStatus.STAGING):
        _set_status(rollout, RolloutStatus.STAGING)
        try:
            folder = stage_version(deployment, target)
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

    groups = [replicas[:1], replicas[1:]] if rollout.canary and len(replicas) > 1 else [replicas]
    for group in groups:
        group_steps = [steps[r.pk] for r in group]
        _set_status(rollout, RolloutStatus.LOADING)
        _set_steps(group_steps, ReplicaStepStatus.LOADING)
        loaded = _fan_out(
            ctx,
            group,
            lambda client, replica: ensure_loaded(
                client, name, path, ctx.policy, known_version=replica.vllm_version
            ),
        )
        if _failed(ctx, group_steps, loaded, "load"):
            return
        _set_status(rollout, RolloutStatus.VERIFYING)
        _set_steps(group_steps, ReplicaStepStatus.VERIFYING)
        verified = _fan_out(
            ctx,
            group,
            lambda client, replica: verify_serving(
                client,
                name,
                path,
                ctx.policy,
                with_completion=deployment.verify_with_completion,
                base_name=deployment.base_model_name,
            ),
        )
        if _failed(ctx, group_steps, verified, "verification"):
            return
        _set_steps(group_steps, ReplicaStepStatus.SUCCEEDED)
    _succeed(ctx, served)


def _steps_for(rollout: Rollout, replicas: list[Replica]) -> dict[int, ReplicaRollout]:
    """One row per replica; a resumed rollout finds the rows it made before."""
    existing = ReplicaRollout.objects.filter(rollout=rollout, replica__in=replicas)
    steps = {step.replica_id: step for step in existing}
    missing = [ReplicaRollout(rollout=rollout, replica=r) for r in replicas if r.pk not in steps]
    if missing:
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
    by_url = {r.pk: r.base_url for r in ctx.replicas}
    summary = "; ".join(f"{by_url[pk]}: {message}" for pk, message in errors.items())
    _rollback_everywhere(ctx, f"{phase.capitalize()} failed on {len(errors)} replica(s): {summary}")
    return True


def _rollback_everywhere(ctx: _Context, reason: str) -> None:
    """Puts every replica back on the previous version, or unloads the adapter
    where nothing was served before."""
    rollout = ctx.rollout
    previous = rollout.previous_version
    name = rollout.adapter.served_name
    if previous is not None:
        try:
            folder = stage_version(ctx.deployment, previous)
        except (StagingError, OSError) as error:
            _finish(ctx, RolloutStatus.FAILED, f"{reason}. Rollback staging failed: {error}")
            return
        outcomes = _fan_out(
            ctx,
            ctx.replicas,
            lambda client, replica: ensure_loaded(
                client, name, folder.serve_path, ctx.policy, known_version=replica.vllm_version
            ),
        )
        restored = f"v{previous.number}"
    else:
        outcomes = _fan_out(
            ctx, ctx.replicas, lambda client, replica: ensure_unloaded(client, name, ctx.policy)
        )
        restored = "not loaded (there was no previous version)"
    rollback_errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    _set_steps(
        [s for pk, s in ctx.steps.items() if pk not in rollback_errors],
        ReplicaStepStatus.ROLLED_BACK,
    )
    if rollback_errors:
        by_url = {r.pk: r.base_url for r in ctx.replicas}
        detail = "; ".join(f"{by_url[pk]}: {m}" for pk, m in rollback_errors.items())
        _finish(
            ctx,
            RolloutStatus.FAILED,
            f"{reason}. Rollback to {restored} failed on {detail}; reconcile will keep trying.",
        )
        return
    _finish(ctx, RolloutStatus.ROLLED_BACK, f"{reason}. Every replica is back on {restored}.")


def _finish(ctx: _Context, status: str, error: str) -> None:
    with transaction.atomic():
        _set_status(ctx.rollout, status, error=error[:10000], finished_at=timezone.now())
        audit_record(
            actor=None,
            action=f"rollout.{status}",
            obj=ctx.rollout,
            department=ctx.rollout.adapter.department,
            to_state=status,
            comment=error[:2000],
        )


def _succeed(ctx: _Context, served: ServedAdapter) -> None:
    rollout = ctx.rollout
    with transaction.atomic():
        ServedAdapter.objects.filter(pk=served.pk).update(
            version=rollout.target_version,
            served_path=rollout.served_path,
            updated_at=timezone.now(),
        )
        _set_status(rollout, RolloutStatus.SUCCEEDED, error="", finished_at=timezone.now())
        audit_record(
            actor=None,
            action="rollout.succeeded",
            obj=rollout,
            department=rollout.adapter.department,
            to_state=RolloutStatus.SUCCEEDED,
            details={"served_path": rollout.served_path},
        )
        _note_observed(ctx, rollout.adapter.served_name, rollout.served_path)
        mark_unreferenced(ctx.deployment)
        served_version_changed.send(
            sender=Rollout,
            deployment=ctx.deployment,
            adapter=rollout.adapter,
            version=rollout.target_version,
        )


def _note_observed(
    ctx: _Context, name: str, root: str | None, only: set[int] | None = None
) -> None:
    """What the rollout saw each replica serve, so the state view is right before
    the next reconcile looks again."""
    for replica in ctx.replicas:
        if only is not None and replica.pk not in only:
            continue
        loaded = [item for item in replica.loaded_adapters or [] if item.get("id") != name]
        if root is not None:
            loaded.append({"id": name, "root": root})
        Replica.objects.filter(pk=replica.pk).update(loaded_adapters=loaded)


def _retire(ctx: _Context, served: ServedAdapter) -> None:
    name = ctx.rollout.adapter.served_name
    _set_status(ctx.rollout, RolloutStatus.LOADING)
    _set_steps(list(ctx.steps.values()), ReplicaStepStatus.LOADING)
    outcomes = _fan_out(
        ctx, ctx.replicas, lambda client, r: ensure_unloaded(client, name, ctx.policy)
    )
    errors = {pk: o.error for pk, o in outcomes.items() if not o.ok}
    _set_steps([s for pk, s in ctx.steps.items() if pk not in errors], ReplicaStepStatus.SUCCEEDED)
    _set_steps([s for pk, s in ctx.steps.items() if pk in errors], ReplicaStepStatus.FAILED, errors)
    with transaction.atomic():
        if errors:
            _set_status(
                ctx.rollout,
                RolloutStatus.FAILED,
                error="Unload failed on some replicas; reconcile will retry: "
                + "; ".join(errors.values()),
                finished_at=timezone.now(),
            )
        else:
            _set_status(ctx.rollout, RolloutStatus.SUCCEEDED, finished_at=timezone.now())
        _note_observed(ctx, name, None, only={pk for pk in ctx.steps if pk not in errors})
        mark_unreferenced(ctx.deployment)
        served_version_changed.send(
            sender=Rollout, deployment=ctx.deployment, adapter=ctx.rollout.adapter, version=None
        )
