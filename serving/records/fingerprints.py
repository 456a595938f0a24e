"""Fingerprints: proof that every replica serves the same weights for a version.

The first replica to pass verification records what the version's adapter does
to the probe (serving/rules/probe.py) as the version's fingerprint on that
deployment. Every other replica, in the rollout and in the reconcile's deferred
steps, must match it within SERVING_FINGERPRINT_TOLERANCE. The reconcile also
re-probes a few adapters per replica on every tick, rotating through them
(next_in_rotation), so weights that went stale after a swap, or a replica
reading other files under the right path, are found and reloaded: a mismatch is
one kind of the reconcile's repair jobs (serving/reconcile/weight_check.py).

This module records and compares; the probes themselves are HTTP
(serving.fanout.verify_with_fingerprint), and its database work happens before
or after them, never with a row lock held across one.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import JSONField, OuterRef, Subquery

from serving.models import (
    Deployment,
    Replica,
    Rollout,
    VersionFingerprint,
)
from serving.replica_calls import (
    ReplicaOutcome,
)
from serving.rules.probe import Probe, describe_distance

logger = logging.getLogger(__name__)


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
    version_id = rollout.target_version_id
    assert version_id is not None, f"rollout {rollout.pk} swaps in no version"
    agreed = True
    for replica in replicas:
        agreed &= fingerprint_check(
            outcomes[replica.pk],
            deployment=rollout.deployment,
            version_id=version_id,
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
