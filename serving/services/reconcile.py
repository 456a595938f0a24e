"""Reconcile: vLLM forgets (nothing survives a restart, each replica is its own
registry), so the database's desired state is re-applied continuously.

One GET /v1/models per replica; missing adapters are reloaded, wrong roots
corrected, retired ones unloaded, unknown ones reported (and unloaded if the
deployment's policy says so). Every repair is a DriftEvent. A deployment lease
keeps concurrent beats/workers from reconciling the same deployment at once,
and each repair also takes the adapter's lease so it never races a rollout.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.utils import timezone

from core.claims import LeaseLost
from serving.models import (
    Deployment,
    DriftEvent,
    DriftKind,
    Replica,
    ReplicaRollout,
    ReplicaStepStatus,
    RolloutStatus,
    ServedAdapter,
)
from serving.replica_ops import (
    ReplicaOutcome,
    RetryPolicy,
    call_with_retry,
    ensure_loaded,
    ensure_unloaded,
    verify_serving,
)
from serving.replicas import client_for, mark_health, replicas_sync
from serving.services.attempts import attempts_record
from serving.services.fingerprints import fingerprint_check, fingerprints_sample_check
from serving.services.leases import (
    deployment_reconcile_claim,
    deployment_reconcile_heartbeat,
    deployment_reconcile_release,
    served_adapter_claim,
    served_adapter_release,
)
from serving.signals import reconcile_finished
from serving.vllm_client import model_cards, server_version
from serving.volume import StagingError, stage_version

logger = logging.getLogger(__name__)

# Reconcile must not wait a rollout's long retry deadline on a dead replica.
RECONCILE_POLICY = RetryPolicy(deadline_seconds=0, base_delay=0, max_delay=0)


@dataclass
class ReconcileReport:
    deployment: str
    skipped: bool = False
    replicas_up: int = 0
    replicas_down: int = 0
    repairs: list[str] = field(default_factory=list)


def reconcile_deployment(deployment_id: int, worker: str) -> ReconcileReport:
    deployment = Deployment.objects.get(pk=deployment_id)
    report = ReconcileReport(deployment=deployment.name)
    if not deployment_reconcile_claim(deployment.pk, worker):
        report.skipped = True
        return report
    started, ok = time.monotonic(), False
    heartbeat = deployment_reconcile_heartbeat(deployment.pk, worker)
    try:
        _reconcile(deployment, worker, report, heartbeat)
        ok = True
        Deployment.objects.filter(pk=deployment.pk).update(last_reconciled_at=timezone.now())
    except LeaseLost:
        # Took longer than the claim and someone else reconciles now: leave it to them.
        logger.warning("reconcile of %s: claim lost, stopping", deployment.name)
        report.skipped = True
    finally:
        deployment_reconcile_release(deployment.pk, worker)
        for receiver, error in reconcile_finished.send_robust(
            sender=Deployment, deployment=deployment, seconds=time.monotonic() - started, ok=ok
        ):
            if isinstance(error, Exception):
                logger.error(
                    "after reconcile of %s, %r failed: %s", deployment.name, receiver, error
                )
    return report


def _observe(deployment: Deployment, replica: Replica) -> tuple[ReplicaOutcome, list, str | None]:
    outcome = ReplicaOutcome()
    with client_for(replica, deployment) as client:
        version = replica.vllm_version or None
        if not version:
            version = server_version(
                call_with_retry(client.version, "version", outcome, RECONCILE_POLICY)
            )
        listing = call_with_retry(client.list_models, "reconcile_models", outcome, RECONCILE_POLICY)
    if listing.ok:
        outcome.succeed()
    else:
        outcome.fail(listing.error or f"status {listing.status_code}")
    return outcome, [c for c in model_cards(listing) if c.is_adapter], version


def _reconcile(deployment: Deployment, worker: str, report: ReconcileReport, heartbeat) -> None:
    replicas = replicas_sync(deployment)
    desired = {
        s.adapter.served_name: s
        for s in ServedAdapter.objects.filter(deployment=deployment).select_related(
            "adapter__department", "version__adapter__department"
        )
    }

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(replicas) or 1))) as pool:
        observations = list(pool.map(lambda replica: _observe(deployment, replica), replicas))

    for replica, (outcome, cards, version) in zip(replicas, observations, strict=True):
        heartbeat.beat()
        attempts_record(replica, outcome)
        changed = mark_health(replica, up=outcome.ok, error=outcome.error, version=version)
        if not outcome.ok:
            report.replicas_down += 1
            if changed or replica.drift_events.filter(kind=DriftKind.REPLICA_DOWN).count() == 0:
                _drift(deployment, replica, DriftKind.REPLICA_DOWN, detail=outcome.error)
            continue
        report.replicas_up += 1
        if changed:
            _drift(deployment, replica, DriftKind.REPLICA_UP)
        previous_names = {item.get("id") for item in replica.loaded_adapters or []}
        snapshot = {c.id: c.root for c in cards}
        _repair_replica(
            deployment, replica, cards, desired, previous_names, worker, report, snapshot
        )
        # What the replica serves after the repairs: the state view reads it, and the
        # pre-repair listing would show a just-reloaded adapter as missing until next tick.
        Replica.objects.filter(pk=replica.pk).update(
            loaded_adapters=[{"id": name, "root": root} for name, root in snapshot.items()]
        )
        _complete_deferred(deployment, replica, desired, snapshot, report)
        fingerprints_sample_check(
            deployment=deployment,
            replica=replica,
            desired=desired,
            snapshot=snapshot,
            worker=worker,
            report=report,
        )


def _complete_deferred(deployment, replica, desired, snapshot, report) -> None:
    """Steps this replica was deferred from, in rollouts that succeeded and whose
    version is still the desired one: done once the replica lists the version
    and answers through it. A later rollout's version supersedes an older step,
    which stays deferred as the record of what happened."""
    by_adapter = {s.adapter_id: s for s in desired.values()}
    steps = ReplicaRollout.objects.filter(
        replica=replica,
        status=ReplicaStepStatus.DEFERRED,
        rollout__status=RolloutStatus.SUCCEEDED,
    ).select_related("rollout__adapter")
    for step in steps:
        served = by_adapter.get(step.rollout.adapter_id)
        if served is None or served.version_id != step.rollout.target_version_id:
            continue
        name = step.rollout.adapter.served_name
        if served.version_id is None:
            done, error = name not in snapshot, f"{name} is still loaded."
        elif snapshot.get(name) != served.served_path:
            continue  # not loaded yet (the repair failed or was left to a rollout)
        else:
            with client_for(replica, deployment) as client:
                outcome = verify_serving(
                    client,
                    name,
                    served.served_path,
                    RECONCILE_POLICY,
                    with_completion=deployment.verify_with_completion,
                    base_name=deployment.base_model_name,
                )
            fingerprint_check(
                outcome,
                deployment=deployment,
                version_id=served.version_id,
                replica=replica,
                name=name,
            )
            attempts_record(replica, outcome, step)
            done, error = outcome.ok, outcome.error
        if done:
            ReplicaRollout.objects.filter(pk=step.pk, status=ReplicaStepStatus.DEFERRED).update(
                status=ReplicaStepStatus.SUCCEEDED, error="", updated_at=timezone.now()
            )
            report.repairs.append(
                f"{replica.base_url}: deferred step of rollout {step.rollout_id} verified"
            )
        else:
            ReplicaRollout.objects.filter(pk=step.pk).update(error=error[:2000])


def _repair_replica(
    deployment, replica, cards, desired, previous_names, worker, report, snapshot
) -> None:
    loaded = {card.id: card.root for card in cards}
    for name, served in desired.items():
        if served.version_id is None:
            if name in loaded:
                _repair(
                    deployment,
                    replica,
                    served,
                    worker,
                    report,
                    snapshot,
                    DriftKind.RETIRED_UNLOADED,
                    actual=loaded[name],
                )
            continue
        expected = served.served_path
        if name not in loaded:
            _repair(
                deployment, replica, served, worker, report, snapshot, DriftKind.MISSING_RELOADED
            )
        elif loaded[name] != expected:
            _repair(
                deployment,
                replica,
                served,
                worker,
                report,
                snapshot,
                DriftKind.WRONG_ROOT_CORRECTED,
                actual=loaded[name],
            )
    for name, root in loaded.items():
        if name in desired:
            continue
        if deployment.unload_unknown_adapters:
            with client_for(replica, deployment) as client:
                outcome = ensure_unloaded(client, name, RECONCILE_POLICY)
            attempts_record(replica, outcome)
            kind = DriftKind.UNKNOWN_UNLOADED if outcome.ok else DriftKind.REPAIR_FAILED
            if outcome.ok:
                snapshot.pop(name, None)
            _drift(deployment, replica, kind, name, actual=root, detail=outcome.error)
            report.repairs.append(f"{replica.base_url}: unloaded unknown {name}")
        elif name not in previous_names:
            _drift(deployment, replica, DriftKind.UNKNOWN_REPORTED, name, actual=root)


def _repair(deployment, replica, served, worker, report, snapshot, kind, actual="") -> None:
    # A rollout holding this adapter's lease is already changing it: leave it alone.
    if not served_adapter_claim(served.pk, worker):
        return
    try:
        served.refresh_from_db()
        name = served.adapter.served_name
        with client_for(replica, deployment) as client:
            if served.version_id is None:
                outcome = ensure_unloaded(client, name, RECONCILE_POLICY)
            else:
                try:
                    # The folder may have gone: a new volume, or a replica added later.
                    stage_version(deployment, served.version)
                except (StagingError, OSError) as error:
                    _drift(deployment, replica, DriftKind.REPAIR_FAILED, name, detail=str(error))
                    return
                outcome = ensure_loaded(
                    client,
                    name,
                    served.served_path,
                    RECONCILE_POLICY,
                    known_version=replica.vllm_version,
                )
        attempts_record(replica, outcome)
        if outcome.ok:
            if served.version_id is None:
                snapshot.pop(name, None)
            else:
                snapshot[name] = served.served_path
            _drift(deployment, replica, kind, name, expected=served.served_path, actual=actual)
            report.repairs.append(f"{replica.base_url}: {kind} {name}")
        else:
            _drift(
                deployment,
                replica,
                DriftKind.REPAIR_FAILED,
                name,
                expected=served.served_path,
                actual=actual,
                detail=outcome.error,
            )
    finally:
        served_adapter_release(served.pk, worker)


def _drift(deployment, replica, kind, adapter_name="", expected="", actual="", detail="") -> None:
    DriftEvent.objects.create(
        deployment=deployment,
        replica=replica,
        kind=kind,
        adapter_name=adapter_name,
        expected_root=expected or "",
        actual_root=actual or "",
        detail=(detail or "")[:4000],
    )
    logger.info("drift %s on %s: %s %s", kind, replica.base_url, adapter_name, detail)
