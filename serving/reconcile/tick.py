"""Reconcile: vLLM forgets (nothing survives a restart, each replica is its own
registry), so the database's desired state is re-applied continuously.

One tick of one deployment, under the deployment's lease: observe (per replica
GET /v1/models and GET /metrics, once each) -> plan (the repairs each listing
calls for, repairs.py; the sampled weight check, weight_check.py) -> repair
(every kind in one plan, repairs.py) -> the deferred steps of rollouts
(deferred.py) -> write. Every repair is a DriftEvent, and each takes the
adapter's lease so it never races a rollout.

Built for fleets (50 replicas x 500 adapters): a tick where every replica is in
sync costs the same few SQL statements whatever the number of adapters or
replicas (the polls are counted on the replicas in one UPDATE, not stored as
rows; nothing else is written), and repairs run in parallel threads (bounded in
all and per replica) that do HTTP only, while the calling thread keeps the
claims renewed and writes the results in a few bulk statements. See
docs/internals/reconcile.md.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from operator import itemgetter

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.claims import LeaseLost
from serving.attestation import quarantine_reason
from serving.door.services import door_sync
from serving.fact_readings import REPORTED_FLAGS, base_card_facts
from serving.fact_readings import disputes as fact_disputes
from serving.fanout import NO_RETRY, on_replicas, replica_session
from serving.models import Deployment, DriftKind, Replica, ServedAdapter
from serving.reconcile.deferred import complete_deferred
from serving.reconcile.jobs import Keeper, ReconcileReport, Tick, beat_seconds
from serving.reconcile.repairs import defer_early_unloads, plan_repairs, repair
from serving.reconcile.weight_check import (
    Sampled,
    plan_weight_check,
    probe_sample,
    weight_sample,
)
from serving.records.attempts import attempts_record_all
from serving.records.drifts import DriftRecorder
from serving.records.fingerprints import fingerprint_probe_annotation
from serving.records.leases import (
    deployment_reconcile_claim,
    deployment_reconcile_heartbeat,
    deployment_reconcile_release,
)
from serving.records.placements import placement_tick
from serving.replica_calls import MetricsReading, ReplicaOutcome, call_with_retry, metrics_read
from serving.replica_rows import health_changes, replicas_sync
from serving.signals import reconcile_finished
from serving.sync_state import as_listing, loaded_adapters
from serving.vllm_client import model_cards, server_version

logger = logging.getLogger(__name__)

# Facts a replica reports outside the listing this tick reads (kept across ticks).
REPORTED_ELSEWHERE = frozenset(flag.fact for flag in REPORTED_FLAGS)


def reconcile_deployment(deployment_id: int, worker: str) -> ReconcileReport:
    deployment = Deployment.objects.get(pk=deployment_id)
    report = ReconcileReport(deployment=deployment.name)
    report.quarantined = quarantine_reason(deployment)
    if report.quarantined:
        # Quarantined after a restore (serving/services/restore.py): no call at all, so
        # the vLLM key never goes to a URL the audit chain does not name; a front
        # door still running is left with no servers and no upstream key.
        report.skipped = True
        door_sync(deployment)
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
    version: str | None
    facts: dict
    # Served name -> root, as listed ("" where it names none).
    listed: dict[str, str] = field(default_factory=dict)
    # Its /metrics, read once a tick where the listing answered (None: not read).
    reading: MetricsReading | None = None
    # The weight check's probes, sent after that read (None: none asked).
    sampled: Sampled | None = None


def _observer(deployment: Deployment, desired: dict, chosen: list[str]):
    """The observe step for one replica: GET /v1/models, then GET /metrics,
    the tick's only read of it (the reported max_lora, and observability's
    activity and placement's demand use it), then the weight check's probes
    of the `chosen` adapters it lists (weight_check.py), which that read is
    the one before."""
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
        seen = _Observed(outcome, version, base_card_facts(cards))
        if not outcome.ok:
            return seen
        # The adapters' cards as loaded_from's mapping (their ids are strings).
        seen.listed = {c.id: c.root or "" for c in cards if c.is_adapter and c.id}
        if metrics:
            # The thread's session to the replica, the one the listing went through.
            seen.reading = metrics_read(
                replica.base_url, api_key=api_key, session=replica_session(replica.base_url)
            )
        if chosen:
            seen.sampled = probe_sample(client, chosen, desired, seen.listed)
        return seen

    return observe


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
    keeper = Keeper(heartbeat, worker)
    drifts = DriftRecorder(deployment)

    chosen = weight_sample(deployment, desired)
    observations = on_replicas(
        deployment,
        replicas,
        _observer(deployment, desired, chosen),
        limit=32,
        tick=keeper.beat,
        interval=beat_seconds(),
    )
    keeper.beat()

    ticks: list[Tick] = []
    for replica, seen in zip(replicas, observations, strict=True):
        outcome, facts = seen.outcome, seen.facts
        changes, flipped = health_changes(
            replica, up=outcome.ok, error=outcome.error, version=seen.version, now=now
        )
        tick = Tick(replica, outcome, changes, flipped)
        if seen.reading is not None:
            report.readings[replica.pk] = seen.reading
            snapshot = seen.reading.snapshot
            if snapshot is not None and snapshot.max_lora is not None:
                facts["max_lora"] = snapshot.max_lora
        if outcome.ok:
            # max_lora_rank comes from a refused load (serving.records.fact_records),
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
        tick.snapshot = seen.listed

    up = [tick for tick in ticks if tick.outcome.ok]
    # Where each adapter lives this tick (written only where it changed), then
    # what each replica needs to match it.
    placement_tick(deployment, desired, replicas, up={t.replica.pk for t in up}, now=now)
    plan_repairs(deployment, up, desired, drifts)
    defer_early_unloads(up, desired, now)
    sampled = {
        replica.pk: seen.sampled
        for replica, seen in zip(replicas, observations, strict=True)
        if seen.sampled is not None
    }
    report.fingerprint_cursor = plan_weight_check(up, desired, chosen, sampled, report)

    jobs = [job for tick in ticks for job in tick.jobs]
    if jobs:
        repair(deployment, worker, jobs, keeper, drifts, report)

    for tick in up:
        complete_deferred(deployment, tick, desired, report)
    keeper.beat()
    _write(ticks, drifts, now, report)


def _as_recorded(snapshot: dict[str, str], replica: Replica) -> bool:
    """Whether `snapshot` is what the replica's row says it served. Usually the
    listing is the same in the same order: that is told by comparing lists,
    which runs in C (32 x 500 entries a tick); otherwise as mappings."""
    recorded = replica.loaded_adapters or []
    if len(recorded) != len(snapshot):
        return False
    try:
        ids = list(map(itemgetter("id"), recorded))
        roots = list(map(itemgetter("root"), recorded))
    except (KeyError, TypeError):
        return snapshot == loaded_adapters(replica)
    if ids == list(snapshot) and roots == list(snapshot.values()):
        return True
    return snapshot == loaded_adapters(replica)


def _write(ticks: list[Tick], drifts: DriftRecorder, now, report: ReconcileReport) -> None:
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
        if tick.outcome.ok and not _as_recorded(tick.snapshot, replica):
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
