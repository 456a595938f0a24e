"""Writes of the observability app: what each reconcile took, and what the
replicas' /metrics said about their adapters (read once a tick by the
reconcile's observe step and handed over here: never read again).

`reconcile_observed` is the one hook serving's reconcile calls. Nothing in it
may break a reconcile: its own failures are logged and swallowed, and the
reconcile's exception (if any) passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, F, Max, Value, When
from django.db.models.expressions import Combinable
from django.db.models.functions import Cast
from django.utils import timezone

from observability.models import (
    RECONCILE_BUCKETS,
    AdapterActivity,
    AttemptTally,
    ReconcileStats,
    ReplicaLoraState,
)
from observability.unmetered import unmetered_tokens_reconcile
from observability.usage import front_door_usage_record
from observability.vllm_metrics import clients_only, demand_units
from registry.models import Adapter
from serving.lora_metrics import LoraSnapshot
from serving.models import Deployment, HttpAttempt, Replica
from serving.records.attempts import attempts_record_all
from serving.records.own_probes import own_probes_marked, own_probes_settle
from serving.records.placements import replica_demand_report
from serving.replica_calls import MetricsReading

logger = logging.getLogger(__name__)


def reconcile_finished(
    sender,
    *,
    deployment: Deployment,
    seconds: float,
    ok: bool,
    replicas: list[Replica] | None = None,
    **kwargs,
):
    """After each reconcile (serving.signals.reconcile_finished): record what
    the tick read from every up replica's /metrics (`readings`, per replica id
    of `replicas`) and what it probed after (`probed`), and the reconcile's
    duration and outcome."""
    # Whether this reconcile stored attempt rows to tally (unknown: assume so).
    wrote = kwargs.get("attempts_written", True)
    readings = kwargs.get("readings")
    if ok and replicas and readings:
        recorded = _guarded(
            vllm_metrics_record, deployment, replicas, readings, kwargs.get("probed")
        )
        wrote = wrote or recorded is None or recorded.wrote_attempts
        # The same reading's token counters against the spans (aborted streams).
        _guarded(unmetered_tokens_reconcile, deployment, replicas, readings)
    if settings.OBSERVABILITY_FRONT_DOOR_USAGE:
        # Whatever the reconcile's outcome: the front door counted requests anyway.
        _guarded(front_door_usage_record, deployment)
    _guarded(reconcile_stats_record, deployment, seconds, ok=ok, tally=wrote)


def _guarded(function, deployment: Deployment, *args, **kwargs):
    try:
        return function(deployment, *args, **kwargs)
    except Exception:  # noqa: BLE001 - observing must never break the reconcile
        logger.exception("%s for %s failed", function.__name__, deployment.name)
        return None


def _bucket(seconds: float) -> int:
    return next(
        (i for i, bound in enumerate(RECONCILE_BUCKETS) if seconds <= bound), len(RECONCILE_BUCKETS)
    )


def reconcile_stats_record(
    deployment: Deployment, seconds: float, *, ok: bool, tally: bool = True
) -> ReconcileStats:
    """Adds one reconcile to the deployment's totals, and tallies the HTTP
    attempts made outside rollouts since the last one (exactly once: by id).
    `tally` False: this reconcile stored no attempt rows (an in-sync tick), so
    the tally query is skipped; rows from elsewhere wait for the next tally."""
    now = timezone.now()
    # The reconcile's claim is held while this runs (serving.reconcile.tick):
    # no other writer, so no transaction or row lock (each costs statements per tick).
    stats, _ = ReconcileStats.objects.get_or_create(deployment=deployment)
    buckets = list(stats.duration_buckets or [])
    buckets += [0] * (len(RECONCILE_BUCKETS) + 1 - len(buckets))
    buckets[_bucket(seconds)] += 1
    stats.duration_buckets = buckets
    stats.runs += 1
    stats.failures += 0 if ok else 1
    stats.duration_seconds_sum += seconds
    stats.last_duration_seconds = seconds
    stats.last_run_at = now
    if ok:
        stats.last_success_at = now
    if not tally:
        stats.save()
        return stats
    with transaction.atomic():  # the tallies and the id they reach, together or not at all
        stats.tallied_attempt_id = _tally_attempts(deployment, stats.tallied_attempt_id)
        stats.save()
    return stats


def _tally_attempts(deployment: Deployment, after_id: int) -> int:
    rows = (
        HttpAttempt.objects.filter(
            replica__deployment=deployment, replica_rollout__isnull=True, pk__gt=after_id
        )
        .values("purpose", "status_code")
        .annotate(n=Count("pk"), top=Max("pk"))
    )
    highest = after_id
    for row in rows:
        status = str(row["status_code"]) if row["status_code"] is not None else "error"
        tally, _ = AttemptTally.objects.get_or_create(
            deployment=deployment, purpose=row["purpose"], status=status
        )
        AttemptTally.objects.filter(pk=tally.pk).update(count=F("count") + row["n"])
        highest = max(highest, row["top"])
    return highest


@dataclass
class MetricsReadings:
    snapshots: dict[int, LoraSnapshot | None] = field(default_factory=dict)
    wrote_attempts: bool = False  # a failed read stored an HttpAttempt row


def vllm_metrics_record(
    deployment: Deployment,
    replicas: list[Replica],
    readings: Mapping[int, MetricsReading],
    probed: Mapping[int, Mapping[str, float]] | None = None,
) -> MetricsReadings:
    """Records what the tick's one read of each replica's /metrics showed
    (`readings`, per replica id; serving.reconcile reads it): each replica's
    LoRA state, when each adapter was last seen active, and each replica's
    demand for placement. A successful read is counted on the replica's state
    (ok_reads); a failed one is an HttpAttempt row. Whatever the number of
    replicas, the states cost one SELECT and one UPDATE.

    Not clients' activity or demand: the tick's weight-check probes, made
    after its read (`probed`, kept on the state for the next read), nor what
    the control plane probed anywhere else (serving.records.own_probes). A
    replica's first successful read is a baseline: what vLLM still lists from
    before is not news."""
    probed = probed or {}
    read = [(r, readings[r.pk]) for r in replicas if r.pk in readings]
    if not read:
        return MetricsReadings()
    replicas = [r for r, _ in read]
    failed = [(r, reading.outcome, None) for r, reading in read if not reading.outcome.ok]
    if failed:
        attempts_record_all(failed)
    result = MetricsReadings(wrote_attempts=bool(failed))
    now = timezone.now()
    # Under the reconcile's claim (see reconcile_stats_record): no row locks.
    states = {
        s.replica_id: s
        for s in ReplicaLoraState.objects.filter(replica_id__in=[r.pk for r in replicas])
    }
    missing = [ReplicaLoraState(replica=r, observed_at=now) for r in replicas if r.pk not in states]
    if missing:
        for state in ReplicaLoraState.objects.bulk_create(missing):
            states[state.replica_id] = state
    before = {s.pk: {f: getattr(s, f) for f in _STATE_FIELDS} for s in states.values()}
    # The earlier ticks' weight-check probes, then what was probed elsewhere
    # (looked up only where a read would count something).
    carried = {r.pk: dict(states[r.pk].own_probes or {}) for r in replicas}
    marks = _own_probes(read, states, before, carried)
    grace = settings.SERVING_OWN_PROBE_GRACE_SECONDS
    # On the clock of vLLM's stamps: the last time each mark's probes can have been current.
    deadlines = {
        pk: {
            **carried[pk],
            **{name: at.timestamp() + grace for name, at in marks.get(pk, {}).items()},
        }
        for pk in carried
    }
    demand = {}
    for replica, reading in read:
        state, snapshot = states[replica.pk], reading.snapshot
        _state_apply(deployment, state, snapshot, reading.outcome, now, deadlines[replica.pk])
        result.snapshots[replica.pk] = snapshot
        if snapshot is not None:
            # Each replica's demand per adapter since the previous read.
            demand[replica.pk] = demand_units(
                _clients_since(snapshot, before[state.pk], deadlines[replica.pk])
            )
        state.own_probes = _carry(
            carried[replica.pk], probed.get(replica.pk), reading if snapshot else None
        )
    _update_rows(ReplicaLoraState, list(states.values()), _STATE_FIELDS, before)
    # For placement (written only where it changed: an idle tick writes nothing).
    replica_demand_report(replicas, demand)
    # Marks whose probes these reads have seen out (only where they answered).
    if marks:
        answered = [r.started_at for _, r in read if r.snapshot is not None]
        own_probes_settle(marks, min(answered))
    return result


def _carry(carried: dict, probed: Mapping[str, float] | None, reading) -> dict:
    """The weight-check marks a replica's next read applies: this tick's, and
    earlier ones that read (`reading`, None if it failed) may not have seen out."""
    if reading is not None:
        seen = reading.started_at.timestamp()
        carried = {name: until for name, until in carried.items() if until >= seen}
    return {**carried, **(probed or {})}


def _own_probes(read, states, before, carried) -> dict[int, dict[str, datetime]]:
    """Per replica id whose read shows label sets that would count as clients',
    the adapters the control plane marked as probed there, with when
    (serving.records.own_probes). Looked up only then: an idle tick costs no query."""
    wanted = [
        replica.pk
        for replica, reading in read
        if reading.snapshot is not None
        and any(
            s.running or s.waiting
            for s in _clients_since(
                reading.snapshot, before[states[replica.pk].pk], carried[replica.pk]
            )
        )
    ]
    if not wanted:
        return {}
    return own_probes_marked(wanted)


def _update_rows(model, rows: list, fields: list[str], before: dict) -> None:
    """bulk_update as one UPDATE, without the transaction bulk_update opens
    (BEGIN and COMMIT are two more statements on every tick), and as small as
    it can be: a column no row changed is left out, one that every row sets to
    the same value (or moves by the same amount) is set once, and only the rest
    need a CASE per row (building those is most of a 32-replica tick's CPU)."""
    if not rows:
        return
    values: dict[str, Combinable] = {}
    for name in fields:
        column = model._meta.get_field(name)
        new = [getattr(row, name) for row in rows]
        old = [before[row.pk][name] for row in rows]
        if new == old:
            continue
        if all(v == new[0] for v in new):
            values[name] = Value(new[0], output_field=column)
            continue
        numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in new + old)
        steps = {n - o for n, o in zip(new, old, strict=True)} if numeric else set()
        if len(steps) == 1:
            values[name] = F(name) + steps.pop()
            continue
        cases = [When(pk=r.pk, then=Value(getattr(r, name), output_field=column)) for r in rows]
        # Cast as bulk_update does: PostgreSQL types a CASE of NULLs as text.
        values[name] = Cast(Case(*cases, output_field=column), output_field=column)
    if values:
        model.objects.filter(pk__in=[row.pk for row in rows]).update(**values)


_STATE_FIELDS = [
    "observed_at",
    "ok",
    "error",
    "max_lora",
    "running",
    "waiting",
    "gpu_loaded",
    "cpu_loaded",
    "series_timestamp",
    "samples",
    "concurrency",
    "peak_running",
    "waiting_samples",
    "ok_reads",
    "own_probes",
]


def _when(timestamp: float, now: datetime) -> datetime:
    # vLLM's clock; never later than ours, whatever the skew.
    return min(datetime.fromtimestamp(timestamp, UTC), now)


def _clients_since(snapshot: LoraSnapshot, previous: dict, marked) -> tuple:
    """The label sets current since the previous read (`previous`: the state's
    fields before this read) that show clients' requests; none at a first read."""
    if not previous["ok_reads"]:
        return ()
    return clients_only(snapshot.since(previous["series_timestamp"]), marked)


def _state_apply(
    deployment, state, snapshot: LoraSnapshot | None, outcome, now, marked=None
) -> None:
    """One read's news on a replica's state (in memory; the caller saves). The
    first successful read sets the baseline: vLLM keeps exporting label sets
    from long before (other control planes' probes, older traffic)."""
    first = not state.ok_reads
    state.observed_at = now
    state.ok = snapshot is not None
    state.error = (outcome.error or "")[:2000]
    if outcome.ok:
        state.ok_reads += 1
    if snapshot is None:
        return
    state.max_lora = snapshot.max_lora
    state.running = list(snapshot.running)
    state.waiting = list(snapshot.waiting)
    state.gpu_loaded = None if snapshot.gpu_loaded is None else list(snapshot.gpu_loaded)
    state.cpu_loaded = None if snapshot.cpu_loaded is None else list(snapshot.cpu_loaded)
    # Old label sets stay exported with the last time they were current: only
    # those current since the previous read are news (a request that came and
    # went between two reads included).
    after = state.series_timestamp
    fresh = snapshot.since(after)
    if fresh:
        state.series_timestamp = max(s.timestamp for s in fresh)
    if first:
        return
    fresh = clients_only(fresh, marked)
    if fresh:
        state.samples += 1
        counts = dict(state.concurrency or {})
        for series in fresh:
            key = str(len(series.running))
            counts[key] = counts.get(key, 0) + 1
        state.concurrency = counts
        state.peak_running = max(state.peak_running, *(len(s.running) for s in fresh))
        if any(s.waiting for s in fresh):
            state.waiting_samples += 1
        _activity_record(deployment, fresh, now)


def _activity_record(deployment: Deployment, fresh, now: datetime) -> None:
    """Per adapter: the latest time a fresh label set showed it, counted once per read."""
    last: dict[str, float] = {}
    running: set[str] = set()
    waiting: set[str] = set()
    for series in fresh:
        for name in (*series.running, *series.waiting):
            last[name] = max(last.get(name, 0.0), series.timestamp)
        running.update(series.running)
        waiting.update(series.waiting)
    if not last:
        return
    adapters = dict(Adapter.objects.filter(served_name__in=last).values_list("served_name", "pk"))
    for name, timestamp in last.items():
        when = _when(timestamp, now)
        activity, _ = AdapterActivity.objects.get_or_create(
            deployment=deployment,
            served_name=name,
            defaults={
                "adapter_id": adapters.get(name),
                "first_active_at": when,
                "last_active_at": when,
            },
        )
        AdapterActivity.objects.filter(pk=activity.pk).update(
            adapter_id=adapters.get(name, activity.adapter_id),
            last_active_at=max(when, activity.last_active_at),
            active_samples=F("active_samples") + (1 if name in running else 0),
            waiting_samples=F("waiting_samples") + (1 if name in waiting else 0),
        )
