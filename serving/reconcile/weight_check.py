"""The tick's sampled weight check: a few adapters a tick are probed on every
replica serving them and compared with their fingerprints; a mismatch becomes
a repair job (repairs.py), planned with the others.

The probes are sent in the observe step's thread for each replica, right
after its listing and its /metrics read (one round of threads a tick, not
two); what they found is judged once the repairs are planned."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.conf import settings

from serving.fanout import NO_RETRY
from serving.models import DriftKind
from serving.reconcile.jobs import RECORD_FINGERPRINT, Job, Tick, target_root
from serving.records.attempts import attempts_record
from serving.records.fingerprints import next_in_rotation, tolerance
from serving.replica_calls import ReplicaOutcome, probe_weights
from serving.rules.probe import Probe
from serving.sync_state import SyncState, classify


@dataclass
class Sampled:
    """What the weight check asked one replica: HTTP only, in a pool thread."""

    outcome: ReplicaOutcome = field(default_factory=ReplicaOutcome)
    asked: list[str] = field(default_factory=list)
    probes: dict[str, Probe] = field(default_factory=dict)


def weight_sample(deployment, desired: dict) -> list[str]:
    """The next SERVING_FINGERPRINT_SAMPLE adapters in the deployment's rotation
    (by name), or none where the deployment does not verify by completion."""
    count = settings.SERVING_FINGERPRINT_SAMPLE
    if count <= 0 or not deployment.verify_with_completion:
        return []
    candidates = [name for name, served in desired.items() if served.version_id is not None]
    return next_in_rotation(candidates, deployment.fingerprint_checked_through, count)


def probe_sample(client, chosen: list[str], desired: dict, listed: dict[str, str]) -> Sampled:
    """In the observe step's thread: the sampled adapters the replica lists at
    their desired path, probed one after another (no database)."""
    sampled = Sampled()
    for name in chosen:
        if classify(target_root(desired[name]), listed.get(name)) != SyncState.IN_SYNC:
            continue  # not served there (yet): the listing's repairs' business
        sampled.asked.append(name)
        probe = probe_weights(client, name, sampled.outcome, NO_RETRY)
        if probe is None:
            # Not answering: each further probe could wait a whole HTTP timeout.
            break
        sampled.probes[name] = probe
    return sampled


def plan_weight_check(
    up: list[Tick], desired: dict, chosen: list[str], sampled: dict[int, Sampled], report
) -> str | None:
    """The weight check's verdicts, once the listings' repairs are planned:
    each probe is compared with its version's fingerprint, which came with the
    desired state. A mismatch becomes a FINGERPRINT_MISMATCH repair job; a
    version without a fingerprint (served since before fingerprints existed)
    gets a job that records one on the first replica serving it; an adapter
    the replica is being repaired for is left to that repair. Returns where
    the rotation stopped (None: no sample).

    Where every probe matches this writes nothing: the probes are part of the
    poll the reconcile counts, and the cursor is saved with the claim's release
    (Deployment.fingerprint_checked_through). Failed probes are stored as
    attempts; the replica's health is the reconcile's business."""
    if not chosen or not up:
        return None  # nothing probed: the rotation stays where it was
    # vLLM's metrics list the probes like clients' requests: the next read (the
    # observe step's, made before them) leaves them out. One that answered ran
    # no later than now; one that did not may still run. One time for every
    # replica: the state rows that keep them take it in one UPDATE's SET.
    done, grace = time.time(), settings.SERVING_OWN_PROBE_GRACE_SECONDS
    unrecorded: set[str] = set()
    for tick in up:
        found = sampled.get(tick.replica.pk)
        if found is None or not found.asked:
            continue
        report.probed[tick.replica.pk] = {
            name: done + (0.0 if name in found.probes else grace) for name in found.asked
        }
        if any(not attempt.ok for _, attempt in found.outcome.attempts):
            attempts_record(tick.replica, found.outcome)
            report.attempts_written = True
            tick.drifted = True
        repairing = {job.name for job in tick.jobs}
        for name, probe in found.probes.items():
            if name in repairing:
                continue
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
