"""Rollouts' deferred steps, finished by the tick: a replica that was down
when a rollout ran gets the version loaded by the repairs, then verified here."""

from __future__ import annotations

from django.utils import timezone

from serving.fanout import NO_RETRY, client_for, verify_with_fingerprint
from serving.models import ReplicaRollout, ReplicaStepStatus, RolloutStatus
from serving.reconcile.jobs import ReconcileReport, Tick, target_root
from serving.records.attempts import attempts_record
from serving.records.fingerprints import fingerprint_check
from serving.records.own_probes import own_probes_record
from serving.sync_state import SyncState, classify


def complete_deferred(deployment, tick: Tick, desired: dict, report: ReconcileReport) -> None:
    """Per replica that answered, once its repairs are done and `tick.snapshot`
    says what it serves now: the steps it was deferred from, in rollouts that
    succeeded and whose version is still the desired one, are done once it
    lists the version and answers through it. A later rollout's version
    supersedes an older step, which stays deferred as the record of what
    happened. (replicas_sync tells which replicas have such steps: the others
    cost no query.)"""
    if not getattr(tick.replica, "has_deferred", True):
        return
    replica, snapshot = tick.replica, tick.snapshot
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
        state = classify(target_root(served), snapshot.get(name))
        if served.version_id is None:
            done, error = state == SyncState.IN_SYNC, f"{name} is still loaded."
        elif state != SyncState.IN_SYNC:
            continue  # not loaded yet (the repair failed or was left to a rollout)
        else:
            own_probes_record([replica], [name])
            with client_for(replica, deployment) as client:
                outcome = verify_with_fingerprint(
                    client, name, served.served_path, NO_RETRY, deployment=deployment
                )
            own_probes_record([replica], [name])
            # Records the version's fingerprint if it has none, else compares.
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
