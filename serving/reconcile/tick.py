"""Reconcile: vLLM forgets (nothing survives a restart, each replica is its own
registry), so the database's desired state is re-applied continuously.

One GET /v1/models per replica; missing adapters are reloaded, wrong roots
corrected, retired ones unloaded, unknown ones reported (and unloaded if the
deployment's policy says so). Every repair is a DriftEvent. A deployment lease
keeps concurrent beats/workers from reconciling the same deployment at once,
and each repair also takes the adapter's lease so it never races a rollout.

Built for fleets (50 replicas x 500 adapters): a tick where every replica is in
sync costs the same few SQL statements whatever the number of adapters or
replicas (the polls are counted on the replicas in one UPDATE, not stored as
rows; nothing else is written), a drift seen again is the same event counted,
and repairs run in parallel threads (bounded in all and per replica) that do
HTTP only, while the calling thread keeps the claims renewed and writes the
results in a few bulk statements.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.claims import LeaseLost
from serving.attestation import refusal
from serving.door.services import gateway_drain_each, gateway_sync
from serving.fact_readings import REPORTED_FLAGS, base_card_facts
from serving.fact_readings import disputes as fact_disputes
from serving.fanout import (
    NO_RETRY,
    client_for,
    fan_out,
    on_replicas,
    replica_session,
    verify_with_fingerprint,
)
from serving.kept_copies import KeptCopy
from serving.models import (
    Deployment,
    DriftKind,
    Replica,
    ReplicaRollout,
    ReplicaStepStatus,
    RolloutStatus,
    ServedAdapter,
)
from serving.placement_plan import placed_keys
from serving.probe import Probe, describe_distance
from serving.replica_calls import (
    MetricsReading,
    ReplicaOutcome,
    call_with_retry,
    ensure_loaded,
    ensure_unloaded,
    metrics_read,
    probe_weights,
    reload_adapter,
)
from serving.replica_rows import health_changes, replicas_sync
from serving.services.attempts import attempts_record, attempts_record_all
from serving.services.drifts import DriftRecorder
from serving.services.fingerprints import (
    fingerprint_check,
    fingerprint_probe_annotation,
    next_in_rotation,
    tolerance,
)
from serving.services.leases import (
    claim_seconds,
    deployment_reconcile_claim,
    deployment_reconcile_heartbeat,
    deployment_reconcile_release,
    served_adapters_claim,
    served_adapters_release,
    served_adapters_renew,
)
from serving.services.own_probes import own_probes_record, own_probes_record_each
from serving.services.placements import placement_tick
from serving.signals import reconcile_finished
from serving.sync_state import (
    SyncState,
    as_listing,
    classify,
    desired_root,
    loaded_adapters,
)
from serving.vllm_client import model_cards, server_version
from serving.volume import StagingError, stage_versions

logger = logging.getLogger(__name__)
# Facts a replica reports outside the listing this tick reads (kept across ticks).
REPORTED_ELSEWHERE = frozenset(flag.fact for flag in REPORTED_FLAGS)

# Not a drift: a served version without a fingerprint gets one recorded.
RECORD_FINGERPRINT = "record_fingerprint"

_SERVED_RELATED = ("adapter__department", "version__adapter__department")


def _beat_seconds() -> float:
    """How often the tick's thread renews its claims while replicas' threads work."""
    return claim_seconds() / 6


@dataclass
class ReconcileReport:
    """What one tick of one deployment did."""

    deployment: str
    skipped: bool = False
    # Why nothing was sent: held after a restore (serving.attestation.refusal).
    held: str = ""
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
    # each with when its probe answered (epoch seconds; unanswered: plus
    # SERVING_OWN_PROBE_GRACE_SECONDS): the next read lists them like clients'.
    probed: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)


def reconcile_deployment(deployment_id: int, worker: str) -> ReconcileReport:
    deployment = Deployment.objects.get(pk=deployment_id)
    report = ReconcileReport(deployment=deployment.name)
    report.held = refusal(deployment)
    if report.held:
        # Held after a restore (serving/services/restore.py): no call at all, so
        # the vLLM key never goes to a URL the audit chain does not name; a front
        # door still running is left with no servers and no upstream key.
        report.skipped = True
        gateway_sync(deployment)
        return report
    if not deployment_reconcile_claim(deployment.pk, worker):
        report.skipped = True
        return report
    started, ok = time.monotonic(), False
    heartbeat = deployment_reconcile_heartbeat(deployment.pk, worker)
    try:
        _reconcile(deployment, worker, report, heartbeat)
        ok = True
    except LeaseLost:
        # Took longer than the claim and someone else reconciles now: leave it to them.
        logger.warning("reconcile of %s: claim lost, stopping", deployment.name)
        report.skipped = True
    finally:
        # Sent while the claim is still held: it serialises what observability
        # writes per deployment too, so those writes need no row locks.
        with contextlib.suppress(LeaseLost):
            heartbeat.beat()  # what follows records every replica's /metrics
        for receiver, error in reconcile_finished.send_robust(
            sender=Deployment,
            deployment=deployment,
            seconds=time.monotonic() - started,
            ok=ok,
            replicas=report.up if ok else None,
            attempts_written=report.attempts_written or not ok,
            readings=report.readings if ok else None,
            probed=report.probed,
        ):
            if isinstance(error, Exception):
                logger.error(
                    "after reconcile of %s, %r failed: %s", deployment.name, receiver, error
                )
        done: dict[str, object] = {"last_reconciled_at": timezone.now()} if ok else {}
        if ok and report.fingerprint_cursor is not None:
            done["fingerprint_checked_through"] = report.fingerprint_cursor
        deployment_reconcile_release(deployment.pk, worker, **done)
    return report


@dataclass
class _Observed:
    """One replica as the observe step found it: HTTP only, in a pool thread."""

    outcome: ReplicaOutcome
    cards: list
    version: str | None
    facts: dict
    # Its /metrics, read once a tick where the listing answered (None: not read).
    reading: MetricsReading | None = None


def _observer(deployment: Deployment):
    """The observe step for one replica: GET /v1/models, then GET /metrics,
    the tick's only read of it (the weight check's probes, the reported
    max_lora, and observability's activity and placement's demand all use it)."""
    api_key = deployment.vllm_api_key or None
    metrics = settings.OBSERVABILITY_VLLM_METRICS

    def observe(client, replica: Replica) -> _Observed:
        outcome = ReplicaOutcome()
        version = replica.vllm_version or None
        if not version:
            version = server_version(call_with_retry(client.version, "version", outcome, NO_RETRY))
        listing = call_with_retry(client.list_models, "reconcile_models", outcome, NO_RETRY)
        if listing.ok:
            outcome.succeed()
        else:
            outcome.fail(listing.error or f"status {listing.status_code}")
        cards = model_cards(listing)
        seen = _Observed(
            outcome, [c for c in cards if c.is_adapter], version, base_card_facts(cards)
        )
        if outcome.ok and metrics:
            # The thread's session to the replica, the one the listing went through.
            seen.reading = metrics_read(
                replica.base_url, api_key=api_key, session=replica_session(replica.base_url)
            )
        return seen

    return observe


@dataclass
class _Job:
    """One repair of one adapter on one replica: HTTP only, run in a lane thread.

    Every kind goes through the same plan: the bulk claim, staging, the
    per-replica lanes, bulk attempts and the one drift recorder. A
    FINGERPRINT_MISMATCH is found by the tick's sampled probe; its repair is
    unload, load and verify against the fingerprint again."""

    tick: _Tick
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
class _Tick:
    """Everything one tick decided about one replica."""

    replica: Replica
    outcome: ReplicaOutcome
    changes: dict
    flipped: bool
    snapshot: dict[str, str] = field(default_factory=dict)
    jobs: list[_Job] = field(default_factory=list)
    drifted: bool = False


_REPAIR_FOR = {
    SyncState.MISSING: DriftKind.MISSING_RELOADED,
    SyncState.WRONG_ROOT: DriftKind.WRONG_ROOT_CORRECTED,
    SyncState.NOT_UNLOADED: DriftKind.RETIRED_UNLOADED,
}


def _desired_root(served: ServedAdapter) -> str | None:
    return served.served_path if served.version_id is not None else None


def _job_for(tick: _Tick, name: str, served: ServedAdapter, loaded: dict) -> _Job | None:
    actual = loaded.get(name)
    placed = placed_keys(served)
    state = classify(desired_root(served, tick.replica.pk, placed), actual)
    kind = _REPAIR_FOR.get(state)
    if kind is None:
        return None
    if placed is not None and served.version_id is not None:
        # Placement (serving.placement_plan): loaded where it is placed, and verified
        # there before the front door routes to it; unloaded where it is not.
        if state == SyncState.NOT_UNLOADED:
            kind = DriftKind.UNPLACED_UNLOADED
        elif state == SyncState.MISSING:
            kind = DriftKind.PLACED_LOADED
    return _Job(tick, name, kind, actual or "", served)


class _Keeper:
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


def _reconcile(deployment: Deployment, worker: str, report: ReconcileReport, heartbeat) -> None:
    """observe -> plan (the listings, then the sampled weight check) -> repair
    (every kind in one plan) -> the deferred steps -> write."""
    now = timezone.now()
    replicas = replicas_sync(deployment, with_deferred=True)
    # Only what telling in sync from drifted needs: a repair re-reads what it claims.
    desired = {
        s.adapter.served_name: s
        for s in ServedAdapter.objects.filter(deployment=deployment)
        .select_related("adapter")
        .only(
            "adapter_id",
            "version_id",
            "served_path",
            "adapter__served_name",
            "min_replicas",
            "max_replicas",
            "placement",
            "lease_until",
            "kept_copy",
        )
        # The fingerprints the sampled re-check compares with, in the same query.
        .annotate(fingerprint_probe=fingerprint_probe_annotation())
    }
    keeper = _Keeper(heartbeat, worker)
    drifts = DriftRecorder(deployment)

    observations = on_replicas(
        deployment,
        replicas,
        _observer(deployment),
        limit=32,
        tick=keeper.beat,
        interval=_beat_seconds(),
    )
    keeper.beat()

    ticks: list[_Tick] = []
    for replica, seen in zip(replicas, observations, strict=True):
        outcome, cards, facts = seen.outcome, seen.cards, seen.facts
        changes, flipped = health_changes(
            replica, up=outcome.ok, error=outcome.error, version=seen.version, now=now
        )
        tick = _Tick(replica, outcome, changes, flipped)
        if seen.reading is not None:
            report.readings[replica.pk] = seen.reading
            snapshot = seen.reading.snapshot
            if snapshot is not None and snapshot.max_lora is not None:
                facts["max_lora"] = snapshot.max_lora
        if outcome.ok:
            # max_lora_rank comes from a refused load (serving.services.fact_records),
            # and max_lora from /metrics when this tick could not tell; a replica back
            # from down may have restarted with other flags, so they are unknown
            # until read again.
            kept = {} if flipped else replica.reported_facts or {}
            facts = {**{k: v for k, v in kept.items() if k in REPORTED_ELSEWHERE}, **facts}
        if outcome.ok and facts != (replica.reported_facts or {}):
            # Written only when they change: an in-sync tick stays write-free.
            changes["reported_facts"] = replica.reported_facts = facts
            for dispute in fact_disputes(deployment, [replica]):
                drifts.add(replica, DriftKind.FACT_DISPUTED, detail=dispute.message)
                tick.drifted = True
        ticks.append(tick)
        if not outcome.ok:
            report.replicas_down += 1
            # Every tick while down: the same event, counted (see DriftRecorder).
            drifts.add(replica, DriftKind.REPLICA_DOWN, detail=outcome.error)
            continue
        report.replicas_up += 1
        report.up.append(replica)
        if flipped:
            drifts.add(replica, DriftKind.REPLICA_UP)
            tick.drifted = True
        # loaded_from's mapping, built straight from the cards (their ids are strings).
        tick.snapshot = {c.id: c.root or "" for c in cards if c.id}

    up = [tick for tick in ticks if tick.outcome.ok]
    # Where each adapter lives this tick (written only where it changed), then
    # what each replica needs to match it.
    placement_tick(deployment, desired, replicas, up={t.replica.pk for t in up}, now=now)
    roots = _desired_roots(desired)
    for tick in up:
        _plan(deployment, tick, desired, roots, drifts)
    _hold_early_unloads(up, desired, now)
    report.fingerprint_cursor = _plan_weight_check(deployment, up, desired, keeper, report)

    jobs = [job for tick in ticks for job in tick.jobs]
    if jobs:
        _repair(deployment, worker, jobs, keeper, drifts, report)

    for tick in up:
        _after_repairs(deployment, tick, desired, report)
    keeper.beat()
    _write(ticks, drifts, now, report)


# (served name, row, its path where placed or None if retired, placed keys or None).
_DesiredRoot = tuple[str, ServedAdapter, str | None, frozenset[int] | None]


def _desired_roots(desired: dict) -> list[_DesiredRoot]:
    """Per adapter, once a tick: (name, row, the path it is served from where
    it is placed or None if retired, its placed replica keys or None for every
    replica). What desired_root asks of the row, read once instead of once per
    replica (32 x 500 rows a tick)."""
    return [
        (name, served, _desired_root(served), placed_keys(served))
        for name, served in desired.items()
    ]


def _plan(
    deployment, tick: _Tick, desired: dict, roots: list[_DesiredRoot], drifts: DriftRecorder
) -> None:
    """Which repairs the replica needs, from its listing alone (no I/O)."""
    replica, loaded = tick.replica, tick.snapshot
    pk = replica.pk
    for name, served, path, placed in roots:
        # desired_root on this replica; where the listing shows exactly that
        # (both None: retired and gone), classify says in sync: no job.
        root = path if path is not None and (placed is None or pk in placed) else None
        if loaded.get(name) == root:
            continue
        job = _job_for(tick, name, served, loaded)
        if job is not None:
            tick.jobs.append(job)
    previous_names: set[str] | None = None  # read only if an unknown adapter is listed
    for name, root in loaded.items():
        if name in desired:
            continue
        if previous_names is None:
            previous_names = set(loaded_adapters(replica))
        if deployment.unload_unknown_adapters:
            tick.jobs.append(_Job(tick, name, DriftKind.UNKNOWN_UNLOADED, root))
        elif name not in previous_names:
            drifts.add(replica, DriftKind.UNKNOWN_REPORTED, name, actual=root)
            tick.drifted = True


def _hold_early_unloads(up: list[_Tick], desired: dict, now) -> None:
    """Make before break: an adapter leaves a replica placement no longer puts
    it on only once every replica that placement puts it on and that is up
    serves it from its path (loaded and verified by an earlier tick). The copy
    of the version before that a swap left on a replica, drained
    (ServedAdapter.kept_copy, serving.kept_copies), stays until its time is up, whether placement
    moved the adapter off that replica or not: a rollback meanwhile moves the
    traffic back to it instead of reloading it."""
    busy = {(tick.replica.pk, job.name) for tick in up for job in tick.jobs}
    epoch = now.timestamp()

    def kept(job: _Job) -> bool:
        keep = KeptCopy.from_dict(getattr(desired[job.name], "kept_copy", None))
        return keep.keeps(job.replica.pk, job.actual, epoch)

    def served_where_placed(name: str) -> bool:
        served = desired[name]
        placed = [t for t in up if t.replica.pk in (placed_keys(served) or ())]
        return bool(placed) and all(
            t.snapshot.get(name) == served.served_path and (t.replica.pk, name) not in busy
            for t in placed
        )

    def held(job: _Job) -> bool:
        if job.kind not in (DriftKind.UNPLACED_UNLOADED, DriftKind.WRONG_ROOT_CORRECTED):
            return False
        if job.name in desired and kept(job):
            return True
        return job.kind == DriftKind.UNPLACED_UNLOADED and not served_where_placed(job.name)

    for tick in up:
        tick.jobs = [job for job in tick.jobs if not held(job)]


def _plan_weight_check(deployment, up: list[_Tick], desired, keeper, report) -> str | None:
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
            if classify(_desired_root(desired[name]), snapshot.get(name)) == SyncState.IN_SYNC
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
        interval=_beat_seconds(),
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
                        _Job(tick, name, RECORD_FINGERPRINT, served.served_path, served)
                    )
                continue
            distance = Probe.from_dict(served.fingerprint_probe).distance(probe)
            if distance > tolerance():
                job = _Job(tick, name, DriftKind.FINGERPRINT_MISMATCH, served.served_path, served)
                job.distance = distance
                tick.jobs.append(job)
    return chosen[-1]


def _repair(deployment, worker, jobs: list[_Job], keeper: _Keeper, drifts, report) -> None:
    # A rollout holding an adapter's lease is already changing it: leave it alone.
    wanted = {job.served.pk for job in jobs if job.served is not None}
    claimed = served_adapters_claim(wanted, worker) if wanted else set()
    keeper.served = claimed
    try:
        # Re-read what we hold: a rollout may have moved the version before we got it.
        fresh = {
            s.pk: s
            for s in ServedAdapter.objects.filter(pk__in=claimed).select_related(*_SERVED_RELATED)
        }
        runnable = []
        for job in jobs:
            if job.served is None:
                runnable.append(job)
                continue
            served = fresh.get(job.served.pk)
            if served is None:
                continue
            again = _replan(job, served)
            if again is not None:
                runnable.append(again)
        runnable = _drain_unplaced(deployment, runnable, keeper)
        _stage(deployment, [job for job in runnable if job.loads], keeper)
        _run_lanes(deployment, [job for job in runnable if not job.staging_error], keeper)
        for job in runnable:
            _record(deployment, job, drifts, report)
        made = [(job.replica, job.outcome, None) for job in runnable if job.outcome is not None]
        if made:
            attempts_record_all(made)
            report.attempts_written = True
    finally:
        if claimed:
            served_adapters_release(claimed, worker)
        keeper.served = set()


def _drain_unplaced(deployment, jobs: list[_Job], keeper: _Keeper) -> list[_Job]:
    """Before an adapter leaves a replica placement moved it from, the front
    door stops sending it there and its requests in flight finish (all such
    drains at once, the claims renewed meanwhile). Where the front door finds
    that replica the only one serving it, it stays."""
    leaving = [job for job in jobs if job.kind == DriftKind.UNPLACED_UNLOADED]
    if not leaving:
        return jobs
    answers = gateway_drain_each(
        deployment,
        [(job.name, job.replica) for job in leaving],
        keep_one=True,
        tick=keeper.beat,
        interval=_beat_seconds(),
    )
    kept = {
        id(job)
        for job, changes in zip(leaving, answers, strict=True)
        if any(change.startswith("kept ") for change in changes)
    }
    return [job for job in jobs if id(job) not in kept]


def _replan(job: _Job, served: ServedAdapter) -> _Job | None:
    """The job again, against the row as it is now that it is claimed."""
    if job.kind in (DriftKind.FINGERPRINT_MISMATCH, RECORD_FINGERPRINT):
        if (served.version_id, served.served_path) != (
            job.row.version_id,
            job.row.served_path,
        ):
            return None  # a rollout finished in between: the next tick checks the new version
        # The probe the tick's query annotated (fingerprint_probe_annotation).
        served.fingerprint_probe = job.row.fingerprint_probe  # type: ignore[attr-defined]
        job.served = served
        return job
    missing = (DriftKind.MISSING_RELOADED, DriftKind.PLACED_LOADED)
    seen = {} if job.kind in missing else {job.name: job.actual}
    # A placed load verifies against the fingerprint the tick read (an
    # annotation of the tick's query, unknown to the model's type).
    served.fingerprint_probe = getattr(job.served, "fingerprint_probe", None)  # type: ignore[attr-defined]
    return _job_for(job.tick, job.name, served, seen)


def _stage(deployment, jobs: list[_Job], keeper: _Keeper) -> None:
    """The folders every load needs, each version once however many replicas
    miss it; a folder already verified is not read again (serving.volume). A
    fingerprint mismatch's folder may be damaged on disk: staging checks it."""
    wanted = [(job, job.row.version) for job in jobs]
    # A job that loads has a version (_Job.loads).
    versions = {version.pk: version for _, version in wanted if version is not None}
    if not versions:
        return
    # The folder may have gone: a new volume, or a replica added later.
    staged = stage_versions(deployment, list(versions.values()), progress=keeper.beat)
    for job, version in wanted:
        if version is None:
            continue
        result = staged[version.pk]
        if isinstance(result, StagingError):
            job.staging_error = str(result)


def _lanes(jobs: list[_Job]) -> list[list[_Job]]:
    """Each replica's jobs dealt into at most SERVING_RECONCILE_PER_REPLICA lanes
    run one after another, so no replica gets more loads at once than that."""
    per_replica = settings.SERVING_RECONCILE_PER_REPLICA
    by_replica: dict[int, list[_Job]] = {}
    for job in jobs:
        by_replica.setdefault(job.replica.pk, []).append(job)
    lanes = []
    for mine in by_replica.values():
        count = min(per_replica, len(mine))
        lanes += [mine[i::count] for i in range(count)]
    return lanes


def _run_lanes(deployment, jobs: list[_Job], keeper: _Keeper) -> None:
    """The HTTP of every repair, in lane threads that touch no database
    (serving.fanout); this thread renews the claims meanwhile and stops the
    lanes if a claim is lost."""
    if not jobs:
        return
    stop = threading.Event()

    def run(lane: list[_Job]) -> None:
        replica = lane[0].replica
        with client_for(replica, deployment, replica_session(replica.base_url)) as client:
            for job in lane:
                if stop.is_set():
                    return
                _run_job(deployment, client, job)

    lanes = _lanes(jobs)
    # Their verification requests are ours, not demand (serving.services.own_probes).
    probing = [(job.replica, job.name) for job in jobs if job.kind in _PROBING]
    own_probes_record_each(probing)
    try:
        fan_out(
            lanes,
            run,
            limit=settings.SERVING_RECONCILE_CONCURRENCY,
            tick=keeper.beat,
            interval=_beat_seconds(),
        )
    except BaseException:
        stop.set()
        raise
    finally:
        own_probes_record_each(probing)


# The repairs that send requests through the adapter (_run_job).
_PROBING = (DriftKind.FINGERPRINT_MISMATCH, RECORD_FINGERPRINT, DriftKind.PLACED_LOADED)


def _run_job(deployment, client, job: _Job) -> None:
    if job.kind == DriftKind.FINGERPRINT_MISMATCH:
        _repair_weights(deployment, client, job)
    elif job.kind == RECORD_FINGERPRINT:
        job.outcome = verify_with_fingerprint(
            client, job.name, job.row.served_path, NO_RETRY, deployment=deployment
        )
    elif job.kind == DriftKind.PLACED_LOADED:
        _load_placed(deployment, client, job)
    elif job.loads:
        job.outcome = ensure_loaded(
            client,
            job.name,
            job.row.served_path,
            NO_RETRY,
            known_version=job.replica.vllm_version,
        )
    else:
        job.outcome = ensure_unloaded(client, job.name, NO_RETRY)


def _load_placed(deployment, client, job: _Job) -> None:
    """Load where placement put it, then verify as a rollout does (listed, a
    completion unlike the base model's, the version's fingerprint if it has
    one): the front door routes to a replica only once it lists the adapter, so
    what fails verification is unloaded again."""
    name, path = job.name, job.row.served_path
    probe = getattr(job.served, "fingerprint_probe", None)
    fingerprint = Probe.from_dict(probe) if probe else None
    outcome = job.outcome = ensure_loaded(
        client, name, path, NO_RETRY, known_version=job.replica.vllm_version
    )
    if not outcome.ok:
        return
    verified = verify_with_fingerprint(
        client, name, path, NO_RETRY, deployment=deployment, fingerprint=fingerprint
    )
    outcome.attempts += verified.attempts
    if verified.ok:
        return
    undone = ensure_unloaded(client, name, NO_RETRY)
    outcome.attempts += undone.attempts
    outcome.fail(f"Loaded but not verified, so unloaded again: {verified.error}")


def _repair_weights(deployment, client, job: _Job) -> None:
    """Unload, load, verify against the fingerprint again."""
    name, path = job.name, job.row.served_path
    # The tick's query annotated the row with its probe (fingerprint_probe_annotation).
    fingerprint = Probe.from_dict(job.row.fingerprint_probe)  # type: ignore[attr-defined]
    outcome = job.outcome = ReplicaOutcome()
    # Probed again under the claim: a rollout that failed and rolled back between
    # the sample and the claim reloaded the adapter already.
    probe = probe_weights(client, name, outcome, NO_RETRY)
    if probe is not None:
        job.distance = fingerprint.distance(probe)
    if probe is None or job.distance <= tolerance():
        job.resolved = True
        return
    # Unload, then load: a load of the same name and path is "already loaded"
    # (vLLM keeps what it has), and load_inplace to the same path can reuse stale
    # prefix-cache blocks (vLLM #42125). In the replica's unload lane, and not
    # loaded again while requests of the old load run (they would kill vLLM 0.32).
    steps = [
        lambda: reload_adapter(client, name, path, NO_RETRY, ReplicaOutcome()),
        lambda: verify_with_fingerprint(
            client, name, path, NO_RETRY, deployment=deployment, fingerprint=fingerprint
        ),
    ]
    for step in steps:
        result = step()
        outcome.attempts += result.attempts
        if not result.ok:
            outcome.fail(result.error)
            return
    outcome.succeed()


def _record(deployment, job: _Job, drifts: DriftRecorder, report: ReconcileReport) -> None:
    replica, served = job.replica, job.served
    expected = served.served_path if served is not None else ""
    snapshot = job.tick.snapshot
    if job.staging_error:
        drifts.add(replica, DriftKind.REPAIR_FAILED, job.name, detail=job.staging_error)
        return
    if job.outcome is None:  # stopped before its turn
        return
    if job.kind == RECORD_FINGERPRINT:
        version_id = job.row.version_id  # a sampled row serves a version
        if job.outcome.ok and version_id is not None:
            fingerprint_check(
                job.outcome,
                deployment=deployment,
                version_id=version_id,
                replica=replica,
                name=job.name,
            )
        job.tick.drifted = True
        return
    if job.kind == DriftKind.FINGERPRINT_MISMATCH:
        _record_weights(job, drifts, report)
        return
    if not job.outcome.ok:
        drifts.add(
            replica,
            DriftKind.REPAIR_FAILED,
            job.name,
            expected=expected,
            actual=job.actual,
            detail=job.outcome.error,
        )
        return
    if job.loads:
        snapshot[job.name] = job.row.served_path
    else:
        snapshot.pop(job.name, None)
    drifts.add(replica, job.kind, job.name, expected=expected, actual=job.actual)
    if job.kind == DriftKind.UNKNOWN_UNLOADED:
        report.repairs.append(f"{replica.base_url}: unloaded unknown {job.name}")
    else:
        report.repairs.append(f"{replica.base_url}: {job.kind} {job.name}")


def _record_weights(job: _Job, drifts: DriftRecorder, report: ReconcileReport) -> None:
    replica, path = job.replica, job.row.served_path
    job.tick.drifted = True
    if job.resolved:
        return
    found = (
        f"The probe through {job.name} was off its fingerprint: "
        f"{describe_distance(job.distance)}, above the tolerance {tolerance():g}."
    )
    if job.outcome is None:  # stopped before its turn
        return
    if job.outcome.ok:
        drifts.add(
            replica,
            DriftKind.FINGERPRINT_MISMATCH,
            job.name,
            expected=path,
            actual=path,
            detail=f"{found} Unloaded and loaded again from its path; it matches now.",
        )
        report.repairs.append(f"{replica.base_url}: {DriftKind.FINGERPRINT_MISMATCH} {job.name}")
    else:
        drifts.add(
            replica,
            DriftKind.REPAIR_FAILED,
            job.name,
            expected=path,
            actual=path,
            detail=f"{found} Reloading did not fix it: {job.outcome.error}",
        )


def _after_repairs(deployment, tick: _Tick, desired: dict, report: ReconcileReport) -> None:
    """Per replica that answered, once its repairs are done and `tick.snapshot`
    says what it serves now. Work that checks a replica beyond its listing goes
    here (and sets tick.drifted if it finds something): the deferred steps of
    rollouts it missed while down."""
    if getattr(tick.replica, "has_deferred", True):
        _complete_deferred(deployment, tick.replica, desired, tick.snapshot, report)


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
        state = classify(_desired_root(served), snapshot.get(name))
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


def _write(ticks: list[_Tick], drifts: DriftRecorder, now, report: ReconcileReport) -> None:
    """The tick's writes. A replica up, in sync and as recorded costs nothing of
    its own: all of them share one UPDATE that counts the poll. Others get their
    row written, and their poll's attempts stored."""
    in_sync: list[int] = []
    quiet_down: list[int] = []
    attempts: list[tuple[Replica, ReplicaOutcome, None]] = []
    for tick in ticks:
        replica = tick.replica
        changes = dict(tick.changes)
        # Compared as a mapping: a replica reloaded in another order serves the same.
        if tick.outcome.ok and tick.snapshot != loaded_adapters(replica):
            # What the replica serves after the repairs: the state view reads it, and the
            # pre-repair listing would show a just-reloaded adapter as missing until next tick.
            listing = as_listing(tick.snapshot)
            changes["loaded_adapters"] = listing
            replica.loaded_adapters = listing
        if not changes and not tick.jobs and not tick.drifted:
            # Up and in sync, or down exactly as last tick: its poll is only counted
            # (in_sync_polls, or the replica_down event's count).
            (in_sync if tick.outcome.ok else quiet_down).append(replica.pk)
            continue
        attempts.append((replica, tick.outcome, None))
        extra = {"last_seen_at": now} if tick.outcome.ok else {}
        Replica.objects.filter(pk=replica.pk).update(
            **changes, **extra, last_checked_at=now, in_sync_since=None
        )
        replica.in_sync_since = None
    if in_sync:
        Replica.objects.filter(pk__in=in_sync).update(
            in_sync_polls=F("in_sync_polls") + 1,
            in_sync_since=Coalesce(F("in_sync_since"), now),
            last_checked_at=now,
            last_seen_at=now,
        )
    if quiet_down:
        Replica.objects.filter(pk__in=quiet_down).update(last_checked_at=now)
    report.in_sync = len(in_sync)
    if attempts:
        attempts_record_all(attempts)
        report.attempts_written = True
    drifts.flush(now)
