"""The tick's repairs: which jobs each replica's listing calls for (no I/O),
which unloads wait for the adapter to be served where placement puts it, and
running every kind in one plan: the bulk claim, staging, per-replica lanes of
HTTP-only threads, bulk attempts and the one drift recorder."""

from __future__ import annotations

import threading

from django.conf import settings

from serving.door.services import door_drain_each
from serving.fanout import NO_RETRY, client_for, fan_out, replica_session, verify_with_fingerprint
from serving.models import DriftKind, ServedAdapter
from serving.reconcile.jobs import (
    RECORD_FINGERPRINT,
    Job,
    Keeper,
    ReconcileReport,
    Tick,
    beat_seconds,
    target_root,
)
from serving.records.attempts import attempts_record_all
from serving.records.drifts import DriftRecorder
from serving.records.fingerprints import fingerprint_check, tolerance
from serving.records.leases import served_adapters_claim, served_adapters_release
from serving.records.own_probes import own_probes_record_each
from serving.replica_calls import (
    ReplicaOutcome,
    ensure_loaded,
    ensure_unloaded,
    probe_weights,
    reload_adapter,
)
from serving.rules.kept_copies import KeptCopy
from serving.rules.placement_plan import placed_keys
from serving.rules.probe import Probe, describe_distance
from serving.sync_state import SyncState, classify, desired_root, loaded_adapters
from serving.volume import StagingError, stage_versions

_SERVED_RELATED = ("adapter__department", "version__adapter__department")


_REPAIR_FOR = {
    SyncState.MISSING: DriftKind.MISSING_RELOADED,
    SyncState.WRONG_ROOT: DriftKind.WRONG_ROOT_CORRECTED,
    SyncState.NOT_UNLOADED: DriftKind.RETIRED_UNLOADED,
}


def _job_for(tick: Tick, name: str, served: ServedAdapter, loaded: dict) -> Job | None:
    actual = loaded.get(name)
    placed = placed_keys(served)
    state = classify(desired_root(served, tick.replica.pk, placed), actual)
    kind = _REPAIR_FOR.get(state)
    if kind is None:
        return None
    if placed is not None and served.version_id is not None:
        # Placement (serving.rules.placement_plan): loaded where it is placed, and verified
        # there before the front door routes to it; unloaded where it is not.
        if state == SyncState.NOT_UNLOADED:
            kind = DriftKind.UNPLACED_UNLOADED
        elif state == SyncState.MISSING:
            kind = DriftKind.PLACED_LOADED
    return Job(tick, name, kind, actual or "", served)


# (served name, row, its path where placed or None if retired, placed keys or None).
_DesiredRoot = tuple[str, ServedAdapter, str | None, frozenset[int] | None]


def _desired_roots(desired: dict) -> list[_DesiredRoot]:
    """Per adapter, once a tick: (name, row, the path it is served from where
    it is placed or None if retired, its placed replica keys or None for every
    replica). What desired_root asks of the row, read once instead of once per
    replica (32 x 500 rows a tick)."""
    return [
        (name, served, target_root(served), placed_keys(served)) for name, served in desired.items()
    ]


def plan_repairs(deployment, up: list[Tick], desired: dict, drifts: DriftRecorder) -> None:
    """Which repairs each replica that answered needs, from its listing alone
    (no I/O): its jobs go on its Tick."""
    roots = _desired_roots(desired)
    for tick in up:
        _plan_replica(deployment, tick, desired, roots, drifts)


def _plan_replica(
    deployment, tick: Tick, desired: dict, roots: list[_DesiredRoot], drifts: DriftRecorder
) -> None:
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
            tick.jobs.append(Job(tick, name, DriftKind.UNKNOWN_UNLOADED, root))
        elif name not in previous_names:
            drifts.add(replica, DriftKind.UNKNOWN_REPORTED, name, actual=root)
            tick.drifted = True


def defer_early_unloads(up: list[Tick], desired: dict, now) -> None:
    """Drops the unload jobs that come too early (a later tick makes them).
    Make before break: an adapter leaves a replica placement no longer puts
    it on only once every replica that placement puts it on and that is up
    serves it from its path (loaded and verified by an earlier tick). The copy
    of the version before that a swap left on a replica, drained
    (ServedAdapter.kept_copy, serving.rules.kept_copies), stays until its time is
    up, whether placement moved the adapter off that replica or not: a
    rollback meanwhile moves the traffic back to it instead of reloading it."""
    busy = {(tick.replica.pk, job.name) for tick in up for job in tick.jobs}
    epoch = now.timestamp()

    def kept(job: Job) -> bool:
        keep = KeptCopy.from_dict(getattr(desired[job.name], "kept_copy", None))
        return keep.keeps(job.replica.pk, job.actual, epoch)

    def served_where_placed(name: str) -> bool:
        served = desired[name]
        placed = [t for t in up if t.replica.pk in (placed_keys(served) or ())]
        return bool(placed) and all(
            t.snapshot.get(name) == served.served_path and (t.replica.pk, name) not in busy
            for t in placed
        )

    def too_early(job: Job) -> bool:
        """The unload waits for a later tick: the copy is still kept."""
        if job.kind not in (DriftKind.UNPLACED_UNLOADED, DriftKind.WRONG_ROOT_CORRECTED):
            return False
        if job.name in desired and kept(job):
            return True
        return job.kind == DriftKind.UNPLACED_UNLOADED and not served_where_placed(job.name)

    for tick in up:
        tick.jobs = [job for job in tick.jobs if not too_early(job)]


def repair(deployment, worker, jobs: list[Job], keeper: Keeper, drifts, report) -> None:
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


def _drain_unplaced(deployment, jobs: list[Job], keeper: Keeper) -> list[Job]:
    """Before an adapter leaves a replica placement moved it from, the front
    door stops sending it there and its requests in flight finish (all such
    drains at once, the claims renewed meanwhile). Where the front door finds
    that replica the only one serving it, it stays."""
    leaving = [job for job in jobs if job.kind == DriftKind.UNPLACED_UNLOADED]
    if not leaving:
        return jobs
    answers = door_drain_each(
        deployment,
        [(job.name, job.replica) for job in leaving],
        keep_one=True,
        tick=keeper.beat,
        interval=beat_seconds(),
    )
    kept = {
        id(job)
        for job, changes in zip(leaving, answers, strict=True)
        if any(change.startswith("kept ") for change in changes)
    }
    return [job for job in jobs if id(job) not in kept]


def _replan(job: Job, served: ServedAdapter) -> Job | None:
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


def _stage(deployment, jobs: list[Job], keeper: Keeper) -> None:
    """The folders every load needs, each version once however many replicas
    miss it; a folder already verified is not read again (serving.volume). A
    fingerprint mismatch's folder may be damaged on disk: staging checks it."""
    wanted = [(job, job.row.version) for job in jobs]
    # A job that loads has a version (Job.loads).
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


def _lanes(jobs: list[Job]) -> list[list[Job]]:
    """Each replica's jobs dealt into at most SERVING_RECONCILE_PER_REPLICA lanes
    run one after another, so no replica gets more loads at once than that."""
    per_replica = settings.SERVING_RECONCILE_PER_REPLICA
    by_replica: dict[int, list[Job]] = {}
    for job in jobs:
        by_replica.setdefault(job.replica.pk, []).append(job)
    lanes = []
    for mine in by_replica.values():
        count = min(per_replica, len(mine))
        lanes += [mine[i::count] for i in range(count)]
    return lanes


def _run_lanes(deployment, jobs: list[Job], keeper: Keeper) -> None:
    """The HTTP of every repair, in lane threads that touch no database
    (serving.fanout); this thread renews the claims meanwhile and stops the
    lanes if a claim is lost."""
    if not jobs:
        return
    stop = threading.Event()

    def run(lane: list[Job]) -> None:
        replica = lane[0].replica
        with client_for(replica, deployment, replica_session(replica.base_url)) as client:
            for job in lane:
                if stop.is_set():
                    return
                _run_job(deployment, client, job)

    lanes = _lanes(jobs)
    # Their verification requests are ours, not demand (serving.records.own_probes).
    probing = [(job.replica, job.name) for job in jobs if job.kind in _PROBING]
    own_probes_record_each(probing)
    try:
        fan_out(
            lanes,
            run,
            limit=settings.SERVING_RECONCILE_CONCURRENCY,
            tick=keeper.beat,
            interval=beat_seconds(),
        )
    except BaseException:
        stop.set()
        raise
    finally:
        own_probes_record_each(probing)


# The repairs that send requests through the adapter (_run_job).
_PROBING = (DriftKind.FINGERPRINT_MISMATCH, RECORD_FINGERPRINT, DriftKind.PLACED_LOADED)


def _run_job(deployment, client, job: Job) -> None:
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


def _load_placed(deployment, client, job: Job) -> None:
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


def _repair_weights(deployment, client, job: Job) -> None:
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


def _record(deployment, job: Job, drifts: DriftRecorder, report: ReconcileReport) -> None:
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


def _record_weights(job: Job, drifts: DriftRecorder, report: ReconcileReport) -> None:
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
