"""Fingerprints: proof that every replica serves the same weights for a version.

The first replica to pass verification records what the version's adapter does
to the probe (serving/probe.py) as the version's fingerprint on that
deployment. Every other replica, in the rollout and in the reconcile's deferred
steps, must match it within SERVING_FINGERPRINT_TOLERANCE. The reconcile also
re-probes a few adapters per replica on every tick, rotating through them, so
weights that went stale after a swap, or a replica reading other files under the
right path, are found and reloaded.

The probes are HTTP; this module's database work happens before or after them,
never with a row lock held across one.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import JSONField, OuterRef, Subquery

from serving.models import (
    Deployment,
    DriftEvent,
    DriftKind,
    Replica,
    Rollout,
    ServedAdapter,
    VersionFingerprint,
)
from serving.probe import PROBE_PROMPT, PROBE_TOKENS, Probe
from serving.replica_calls import (
    ReplicaOutcome,
    RetryPolicy,
    call_with_retry,
    ensure_loaded,
    ensure_unloaded,
    verify_serving,
)
from serving.replica_rows import client_for
from serving.services.attempts import attempts_record
from serving.services.leases import served_adapter_claim, served_adapter_release
from serving.volume import StagingError, stage_version

logger = logging.getLogger(__name__)

# The reconcile never waits out a retry deadline on one replica: the next tick retries.
_NO_RETRY = RetryPolicy(deadline_seconds=0, base_delay=0, max_delay=0)


def tolerance() -> float:
    return settings.SERVING_FINGERPRINT_TOLERANCE


def fingerprint_compare(
    *,
    deployment: Deployment,
    version_id: int,
    replica: Replica,
    probe: Probe,
    rollout: Rollout | None = None,
) -> tuple[VersionFingerprint, float]:
    """Records `probe` as the version's fingerprint if it has none, and returns
    the fingerprint with the probe's distance from it (0.0 for the one that
    recorded it). Two writers at once cannot both win: the unique constraint
    makes the second insert fail, and get_or_create then reads the first's row."""
    fingerprint, created = VersionFingerprint.objects.get_or_create(
        deployment=deployment,
        version_id=version_id,
        defaults={
            "probe": probe.as_dict(),
            "recorded_from": replica,
            "recorded_from_url": replica.base_url,
            "rollout": rollout,
        },
    )
    if created:
        logger.info(
            "fingerprint of version %s on %s recorded from %s",
            version_id,
            deployment.name,
            replica.base_url,
        )
        return fingerprint, 0.0
    return fingerprint, Probe.from_dict(fingerprint.probe).distance(probe)


def describe_distance(distance: float) -> str:
    if math.isinf(distance):
        return "distance inf: the greedy tokens differ"
    return f"distance {distance:.3g}"


def mismatch_message(name: str, fingerprint: VersionFingerprint, distance: float) -> str:
    return (
        f"{name} serves other weights than this version's fingerprint (recorded from "
        f"{fingerprint.recorded_from_url or 'a replica'}): {describe_distance(distance)}, "
        f"above the tolerance {tolerance():g}."
    )


def fingerprint_check(
    outcome: ReplicaOutcome,
    *,
    deployment: Deployment,
    version_id: int,
    replica: Replica,
    name: str,
    rollout: Rollout | None = None,
) -> bool:
    """Compares a verified outcome's probe with the version's fingerprint (the
    first one records it) and fails the outcome on a mismatch. Returns False
    only for a mismatch; an outcome that failed already, or has no probe
    (verification without a completion), is left as it is."""
    if not outcome.ok or outcome.probe is None:
        return True
    fingerprint, distance = fingerprint_compare(
        deployment=deployment,
        version_id=version_id,
        replica=replica,
        probe=outcome.probe,
        rollout=rollout,
    )
    if distance <= tolerance():
        return True
    outcome.fail(mismatch_message(name, fingerprint, distance))
    return False


def fingerprints_check_rollout(
    *, rollout: Rollout, replicas: list[Replica], outcomes: dict[int, ReplicaOutcome]
) -> None:
    """The rollout's verify step: replicas in the order given (by URL, so the
    canary is first) record or match the target version's fingerprint.

    If a replica disagrees with a fingerprint this same rollout recorded,
    nobody can tell which side has the right weights: the record is dropped
    with the rollout (which fails and rolls back), and the next rollout of the
    version records it afresh. A fingerprint from an earlier rollout stands."""
    agreed = True
    for replica in replicas:
        agreed &= fingerprint_check(
            outcomes[replica.pk],
            deployment=rollout.deployment,
            version_id=rollout.target_version_id,
            replica=replica,
            name=rollout.adapter.served_name,
            rollout=rollout,
        )
    if not agreed:
        VersionFingerprint.objects.filter(
            deployment=rollout.deployment, version_id=rollout.target_version_id, rollout=rollout
        ).delete()


# --- the reconcile's sample -------------------------------------------------------


def next_in_rotation(names: list[str], last: str, count: int) -> list[str]:
    """`count` of the sorted `names`, starting after `last` and wrapping around:
    over successive ticks every name comes up, even as names come and go."""
    ordered = sorted(names)
    after = [n for n in ordered if n > last]
    return (after + [n for n in ordered if n <= last])[:count]


def fingerprint_probe_annotation():
    """Each served adapter's fingerprint probe, as a column of the reconcile's one
    query of the desired state (a sampled tick then costs no SELECT of its own)."""
    return Subquery(
        VersionFingerprint.objects.filter(
            deployment_id=OuterRef("deployment_id"), version_id=OuterRef("version_id")
        ).values("probe")[:1],
        output_field=JSONField(),
    )


@dataclass
class SampleResult:
    cursor: str | None = None  # where the rotation stopped; None: nothing sampled
    drifted: set[int] = field(default_factory=set)  # replicas where something was found


def fingerprints_sample(
    *,
    deployment: Deployment,
    up: list[tuple[Replica, dict[str, str | None]]],
    desired: dict[str, ServedAdapter],
    worker: str,
    report,
) -> SampleResult:
    """One reconcile tick's weight check, after the repairs: the next
    SERVING_FINGERPRINT_SAMPLE adapters in the deployment's rotation are probed
    on every replica that is up and lists them at their desired path (the
    replicas in parallel), and compared with their fingerprints, which came with
    the desired state (`fingerprint_probe`). A mismatch is a FINGERPRINT_MISMATCH
    drift: the adapter is unloaded and loaded again from its path, then verified
    against the fingerprint once more.

    On a tick where every probe matches this writes nothing: the probes are part
    of the poll the reconcile counts, and the cursor is saved with the claim's
    release (Deployment.fingerprint_checked_through). Failed probes are stored
    as attempts; the replica's health is the reconcile's business."""
    result = SampleResult()
    count = settings.SERVING_FINGERPRINT_SAMPLE
    if count <= 0 or not deployment.verify_with_completion or not up:
        return result
    candidates = [name for name, served in desired.items() if served.version_id is not None]
    chosen = next_in_rotation(candidates, deployment.fingerprint_checked_through, count)
    if not chosen:
        return result
    result.cursor = chosen[-1]

    def probe_replica(item):
        replica, snapshot = item
        outcome, probes = ReplicaOutcome(), {}
        with client_for(replica, deployment) as client:
            for name in chosen:
                if snapshot.get(name) != desired[name].served_path:
                    continue  # not served there (yet): the repairs' business
                probe = _probe(client, name, outcome)
                if probe is None:
                    # Not answering: each further probe could wait a whole HTTP timeout.
                    break
                probes[name] = probe
        return outcome, probes

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(up)))) as pool:
        answers = list(pool.map(probe_replica, up))

    unrecorded = set()
    for (replica, _), (outcome, probes) in zip(up, answers, strict=True):
        if any(not attempt.ok for _, attempt in outcome.attempts):
            attempts_record(replica, outcome)
            report.attempts_written = True
            result.drifted.add(replica.pk)
        for name, probe in probes.items():
            served = desired[name]
            if served.fingerprint_probe is None:
                unrecorded.add(name)
                continue
            distance = Probe.from_dict(served.fingerprint_probe).distance(probe)
            if distance > tolerance():
                fingerprint = VersionFingerprint.objects.get(
                    deployment=deployment, version_id=served.version_id
                )
                _repair_weights(deployment, replica, served, fingerprint, distance, worker, report)
                report.attempts_written = True
                result.drifted.add(replica.pk)
    for name in unrecorded:
        # Served since before fingerprints existed (or verified without a completion
        # then): a full verification on the first replica that serves it records one.
        replica = next(r for (r, _), (_, p) in zip(up, answers, strict=True) if name in p)
        _record_missing(deployment, replica, desired[name], name)
        report.attempts_written = True
        result.drifted.add(replica.pk)
    return result


def _record_missing(deployment, replica, served: ServedAdapter, name: str) -> None:
    with client_for(replica, deployment) as client:
        verified = verify_serving(
            client,
            name,
            served.served_path,
            _NO_RETRY,
            with_completion=True,
            base_name=deployment.base_model_name,
        )
    if verified.ok:
        fingerprint_check(
            verified,
            deployment=deployment,
            version_id=served.version_id,
            replica=replica,
            name=name,
        )
    attempts_record(replica, verified)


def _probe(client, name: str, outcome: ReplicaOutcome) -> Probe | None:
    answer = call_with_retry(
        lambda: client.probe(name, prompt=PROBE_PROMPT, max_tokens=PROBE_TOKENS),
        "fingerprint_check",
        outcome,
        _NO_RETRY,
    )
    return Probe.from_body(answer.body) if answer.ok else None


def _repair_weights(
    deployment: Deployment,
    replica: Replica,
    served: ServedAdapter,
    fingerprint: VersionFingerprint,
    distance: float,
    worker: str,
    report,
) -> None:
    # A rollout holding the adapter's lease is changing it right now: its own
    # verification will judge the weights.
    if not served_adapter_claim(served.pk, worker):
        return
    name = served.adapter.served_name
    try:
        version_id, path = served.version_id, served.served_path
        served.refresh_from_db()
        if (served.version_id, served.served_path) != (version_id, path):
            return  # a rollout finished in between: the next tick checks the new version
        outcome = ReplicaOutcome()
        with client_for(replica, deployment) as client:
            # Probed again under the lease: a rollout that failed and rolled back
            # between the sample and the claim reloaded the adapter already.
            probe = _probe(client, name, outcome)
            if probe is not None:
                distance = Probe.from_dict(fingerprint.probe).distance(probe)
            if probe is None or distance <= tolerance():
                attempts_record(replica, outcome)
                return
            try:
                # Its folder may be damaged on disk: staging checks every sha256.
                stage_version(deployment, served.version)
            except (StagingError, OSError) as error:
                attempts_record(replica, outcome)
                _drift(deployment, replica, DriftKind.REPAIR_FAILED, name, path, str(error))
                return
            # Unload, then load: a load of the same name and path is "already
            # loaded" (vLLM keeps what it has), and load_inplace to the same path
            # can reuse stale prefix-cache blocks (vLLM #42125).
            unloaded = ensure_unloaded(client, name, _NO_RETRY)
            outcome.attempts += unloaded.attempts
            repaired = ensure_loaded(
                client, name, path, _NO_RETRY, known_version=replica.vllm_version
            )
            outcome.attempts += repaired.attempts
            if unloaded.ok and repaired.ok:
                repaired = verify_serving(
                    client,
                    name,
                    path,
                    _NO_RETRY,
                    with_completion=True,
                    base_name=deployment.base_model_name,
                )
                outcome.attempts += repaired.attempts
                fingerprint_check(
                    repaired,
                    deployment=deployment,
                    version_id=version_id,
                    replica=replica,
                    name=name,
                )
            elif not unloaded.ok:
                repaired = unloaded
        attempts_record(replica, outcome)
        found = (
            f"The probe through {name} was off its fingerprint "
            f"(recorded from {fingerprint.recorded_from_url or 'a replica'}): "
            f"{describe_distance(distance)}, above the tolerance {tolerance():g}."
        )
        if repaired.ok:
            _drift(
                deployment,
                replica,
                DriftKind.FINGERPRINT_MISMATCH,
                name,
                path,
                f"{found} Unloaded and loaded again from its path; it matches now.",
            )
            report.repairs.append(f"{replica.base_url}: {DriftKind.FINGERPRINT_MISMATCH} {name}")
        else:
            _drift(
                deployment,
                replica,
                DriftKind.REPAIR_FAILED,
                name,
                path,
                f"{found} Reloading did not fix it: {repaired.error}",
            )
    finally:
        served_adapter_release(served.pk, worker)


def _drift(deployment, replica, kind, name, path, detail) -> None:
    DriftEvent.objects.create(
        deployment=deployment,
        replica=replica,
        kind=kind,
        adapter_name=name,
        expected_root=path,
        actual_root=path,
        detail=detail[:4000],
    )
    logger.info("drift %s on %s: %s %s", kind, replica.base_url, name, detail)
