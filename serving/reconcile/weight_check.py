"""The tick's sampled weight check: a few adapters a tick are probed on every
replica serving them and compared with their fingerprints; a mismatch becomes
a repair job (repairs.py), planned with the others."""

from __future__ import annotations

import time

from django.conf import settings

from serving.fanout import NO_RETRY, on_replicas
from serving.models import DriftKind
from serving.probe import Probe
from serving.reconcile.jobs import RECORD_FINGERPRINT, Job, Tick, beat_seconds, target_root
from serving.replica_calls import ReplicaOutcome, probe_weights
from serving.services.attempts import attempts_record
from serving.services.fingerprints import next_in_rotation, tolerance
from serving.sync_state import SyncState, classify


def plan_weight_check(deployment, up: list[Tick], desired, keeper, report) -> str | None:
    """The tick's sampled weight check: the next SERVING_FINGERPRINT_SAMPLE
    adapters in the deployment's rotation are probed on every replica that is up
    and serves them at their desired path (the replicas at once), and compared
    with their fingerprints, which came with the desired state. A mismatch
    becomes a FINGERPRINT_MISMATCH repair job; a version without a fingerprint
    (served since before fingerprints existed) gets a job that records one on
    the first replica serving it. Returns where the rotation stopped.

    Where every probe matches this writes nothing: the probes are part of the
    poll the reconcile counts, and the cursor is saved with the claim's release
    (Deployment.fingerprint_checked_through). Failed probes are stored as
    attempts; the replica's health is the reconcile's business."""
    count = settings.SERVING_FINGERPRINT_SAMPLE
    if count <= 0 or not deployment.verify_with_completion or not up:
        return None
    candidates = [name for name, served in desired.items() if served.version_id is not None]
    chosen = next_in_rotation(candidates, deployment.fingerprint_checked_through, count)
    if not chosen:
        return None
    by_replica = {tick.replica.pk: tick for tick in up}
    grace = settings.SERVING_OWN_PROBE_GRACE_SECONDS

    def probe_replica(client, replica) -> tuple[ReplicaOutcome, dict[str, Probe]]:
        snapshot, planned = by_replica[replica.pk].snapshot, by_replica[replica.pk].jobs
        repairing = {job.name for job in planned}
        outcome, probes = ReplicaOutcome(), {}
        names = [
            name
            for name in chosen
            # Not served there (yet): the listing's repairs' business.
            if classify(target_root(desired[name]), snapshot.get(name)) == SyncState.IN_SYNC
            and name not in repairing
        ]
        # vLLM's metrics list the probes like clients' requests: the next read
        # (the observe step's, read before these) leaves them out. One that
        # answered ran no later than its answer; one that did not may still run.
        marks: dict[str, float] = {}
        for name in names:
            probe = probe_weights(client, name, outcome, NO_RETRY)
            marks[name] = time.time() + (0.0 if probe is not None else grace)
            if probe is None:
                # Not answering: each further probe could wait a whole HTTP timeout.
                break
            probes[name] = probe
        if marks:
            report.probed[replica.pk] = marks
        return outcome, probes

    replicas = [tick.replica for tick in up]
    answers = on_replicas(
        deployment,
        replicas,
        probe_replica,
        limit=32,
        tick=keeper.beat,
        interval=beat_seconds(),
    )
    unrecorded: set[str] = set()
    for tick, (outcome, probes) in zip(up, answers, strict=True):
        if any(not attempt.ok for _, attempt in outcome.attempts):
            attempts_record(tick.replica, outcome)
            report.attempts_written = True
            tick.drifted = True
        for name, probe in probes.items():
            served = desired[name]
            if served.fingerprint_probe is None:
                if name not in unrecorded:
                    unrecorded.add(name)
                    tick.jobs.append(
                        Job(tick, name, RECORD_FINGERPRINT, served.served_path, served)
                    )
                continue
            distance = Probe.from_dict(served.fingerprint_probe).distance(probe)
            if distance > tolerance():
                job = Job(tick, name, DriftKind.FINGERPRINT_MISMATCH, served.served_path, served)
                job.distance = distance
                tick.jobs.append(job)
    return chosen[-1]
