"""What one reconcile tick knows and plans: its report, each replica's
findings and repair jobs, and the keeper of its claims (shared by the tick's
steps: tick.py, repairs.py, weight_check.py, deferred.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from serving.models import DriftKind, Replica, ServedAdapter
from serving.records.leases import claim_seconds, served_adapters_renew
from serving.replica_calls import MetricsReading, ReplicaOutcome

# Not a drift: a served version without a fingerprint gets one recorded.
RECORD_FINGERPRINT = "record_fingerprint"


def beat_seconds() -> float:
    """How often the tick's thread renews its claims while replicas' threads work."""
    return claim_seconds() / 6


@dataclass
class ReconcileReport:
    """What one tick of one deployment did."""

    deployment: str
    skipped: bool = False
    # Why nothing was sent: quarantined after a restore (serving.attestation.quarantine_reason).
    quarantined: str = ""
    replicas_up: int = 0
    replicas_down: int = 0
    repairs: list[str] = field(default_factory=list)
    in_sync: int = 0
    # Whether HttpAttempt rows were stored (an in-sync tick stores none).
    attempts_written: bool = False
    # Where the fingerprint re-check's rotation stopped this tick (None: no sample).
    fingerprint_cursor: str | None = None
    # The replicas found up, for what runs after the reconcile (reconcile_finished).
    up: list[Replica] = field(default_factory=list, repr=False)
    # Per replica id, its /metrics as the observe step read it (once a tick), for
    # observability to record (reconcile_finished): no one reads it again.
    readings: dict[int, MetricsReading] = field(default_factory=dict, repr=False)
    # Per replica id, the adapters the weight check probed there after that read,
    # each with the latest time vLLM may stamp its probe (epoch seconds: when the
    # check ended; unanswered: plus SERVING_OWN_PROBE_GRACE_SECONDS). The next read
    # lists them like clients' requests.
    probed: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)


@dataclass
class Job:
    """One repair of one adapter on one replica: HTTP only, run in a lane thread.

    Every kind goes through the same plan: the bulk claim, staging, the
    per-replica lanes, bulk attempts and the one drift recorder. A
    FINGERPRINT_MISMATCH is found by the tick's sampled probe; its repair is
    unload, load and verify against the fingerprint again."""

    tick: Tick
    name: str
    kind: str
    actual: str = ""
    served: ServedAdapter | None = None  # None: an unknown adapter, unloaded by policy
    outcome: ReplicaOutcome | None = None
    staging_error: str = ""
    # FINGERPRINT_MISMATCH: the sample's distance, then what a probe under the claim found.
    distance: float = 0.0
    # FINGERPRINT_MISMATCH: the probe under the claim matched (a rollout fixed it meanwhile).
    resolved: bool = False

    @property
    def replica(self) -> Replica:
        return self.tick.replica

    @property
    def row(self) -> ServedAdapter:
        """The served row of a job that loads or checks one (only the unload of
        an unknown adapter has none, and it never asks)."""
        assert self.served is not None, f"{self.kind} of {self.name} has no served row"
        return self.served

    @property
    def loads(self) -> bool:
        return (
            self.served is not None
            and self.served.version_id is not None
            and self.kind not in (RECORD_FINGERPRINT, DriftKind.UNPLACED_UNLOADED)
        )


@dataclass
class Tick:
    """Everything one tick decided about one replica."""

    replica: Replica
    outcome: ReplicaOutcome
    changes: dict
    flipped: bool
    snapshot: dict[str, str] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    drifted: bool = False


def target_root(served: ServedAdapter) -> str | None:
    return served.served_path if served.version_id is not None else None


class Keeper:
    """Keeps the deployment's claim and the claimed adapters' claims alive while
    repairs run (hundreds of loads take longer than a claim lasts)."""

    def __init__(self, heartbeat, worker: str):
        self.heartbeat, self.worker = heartbeat, worker
        self.served: set[int] = set()
        self._renewed = time.monotonic()

    def beat(self) -> None:
        self.heartbeat.beat()
        if self.served and time.monotonic() - self._renewed >= claim_seconds() / 3:
            served_adapters_renew(self.served, self.worker)
            self._renewed = time.monotonic()
