"""Every exported metric, computed from the database at scrape time.

No process keeps a metric in memory: gunicorn workers and Celery processes
come and go, and whichever one answers the scrape reads the same rows.
Counters are counts of rows that are never deleted (rollouts, drift events,
rollout attempts) or totals kept in rows (ReconcileStats, AttemptTally), so
they only go up. Each scrape runs a fixed number of aggregate queries,
however many deployments, replicas and adapters there are
(tests/observability/test_collector.py pins the number).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import CollectorRegistry

from mlflow_bridge.models import MirrorState, MlflowAliasMirror, MlflowVersionMirror
from observability.models import (
    RECONCILE_BUCKETS,
    AdapterActivity,
    AttemptTally,
    ReconcileStats,
    ReplicaLoraState,
)
from observability.selectors import deployment_pool_figures
from registry.models import AdapterVersion, VersionStatus
from serving.models import (
    Deployment,
    DriftEvent,
    HttpAttempt,
    Promotion,
    PromotionStatus,
    Replica,
    ReplicaHealth,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.rules.kept_copies import KeptCopy
from serving.rules.placement_plan import placed_keys
from serving.sync_state import SyncState, classify_kept, loaded_adapters

TERMINAL = (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.ROLLED_BACK)
ROLLOUT_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Which HttpAttempt purposes make up each phase of a replica's part in a rollout.
PHASES = {
    "load": ("version", "load", "load_inplace", "unload", "list_models"),
    "verify": ("verify_models", "verify_completion"),
}


def _le(bound: float) -> str:
    return repr(float(bound))


def _histogram(family, labels, counts, total_count, total_sum, bounds):
    """`counts[i]`: observations <= bounds[i] (cumulative, as Prometheus wants)."""
    buckets = [(_le(b), float(c)) for b, c in zip(bounds, counts, strict=True)]
    buckets.append(("+Inf", float(total_count)))
    family.add_metric(labels, buckets, float(total_sum))


def _seconds(value) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value) / 1e6  # some backends hand back microseconds


class ControlPlaneCollector:
    """A prometheus_client collector; `collect()` is one scrape."""

    def describe(self):
        # Describing would run the queries at registration; an empty list is allowed.
        return []

    def collect(self):
        now = timezone.now()
        names = dict(Deployment.objects.values_list("pk", "name"))
        yield from self._rollouts(names)
        yield from self._rollout_histograms(names)
        yield from self._phase_histogram()
        yield from self._attempts(names)
        yield from self._drift(names)
        yield from self._reconcile(names)
        yield from self._replicas_and_adapters(names)
        yield from self._registry()
        yield from self._mirror(now)
        yield from self._activity(names, now)
        yield from self._pool(names)

    # -- rollouts ---------------------------------------------------------------

    def _rollouts(self, names):
        done = CounterMetricFamily(
            "lora_rollouts",
            "Finished rollouts by deployment, kind and outcome.",
            labels=["deployment", "kind", "outcome"],
        )
        running = GaugeMetricFamily(
            "lora_rollouts_in_progress",
            "Rollouts not finished yet.",
            labels=["deployment"],
        )
        in_progress = defaultdict(int)
        for row in Rollout.objects.values("deployment_id", "kind", "status").annotate(
            n=Count("pk")
        ):
            deployment = names.get(row["deployment_id"], "")
            if row["status"] in TERMINAL:
                done.add_metric([deployment, row["kind"], row["status"]], row["n"])
            else:
                in_progress[deployment] += row["n"]
        for deployment in names.values():
            running.add_metric([deployment], in_progress.get(deployment, 0))
        yield done
        yield running

    def _rollout_histograms(self, names):
        total = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        queued = ExpressionWrapper(F("started_at") - F("created_at"), output_field=DurationField())
        aggregates = {
            "n": Count("pk"),
            "total_sum": Sum("total"),
            "queued_sum": Sum("queued"),
        }
        for i, bound in enumerate(ROLLOUT_BUCKETS):
            limit = timedelta(seconds=bound)
            aggregates[f"t{i}"] = Count("pk", filter=Q(total__lte=limit))
            aggregates[f"q{i}"] = Count("pk", filter=Q(queued__lte=limit))
        rows = (
            Rollout.objects.filter(
                status__in=TERMINAL, started_at__isnull=False, finished_at__isnull=False
            )
            .annotate(total=total, queued=queued)
            .values("deployment_id", "kind", "status")
            .annotate(**aggregates)
        )
        duration = HistogramMetricFamily(
            "lora_rollout_duration_seconds",
            "Rollout duration, from a worker starting it to its outcome.",
            labels=["deployment", "kind", "outcome"],
        )
        waited = HistogramMetricFamily(
            "lora_rollout_queue_seconds",
            "Time a rollout waited between being requested and a worker starting it.",
            labels=["deployment", "kind", "outcome"],
        )
        for row in rows:
            labels = [names.get(row["deployment_id"], ""), row["kind"], row["status"]]
            n = len(ROLLOUT_BUCKETS)
            _histogram(
                duration,
                labels,
                [row[f"t{i}"] for i in range(n)],
                row["n"],
                _seconds(row["total_sum"]),
                ROLLOUT_BUCKETS,
            )
            _histogram(
                waited,
                labels,
                [row[f"q{i}"] for i in range(n)],
                row["n"],
                _seconds(row["queued_sum"]),
                ROLLOUT_BUCKETS,
            )
        yield duration
        yield waited

    def _phase_histogram(self):
        """Per replica and rollout: the summed duration of its attempts in each phase."""
        table = HttpAttempt._meta.db_table
        cases, params = [], []
        for phase, purposes in PHASES.items():
            cases.append(f"WHEN purpose IN ({', '.join(['%s'] * len(purposes))}) THEN %s")
            params += [*purposes, phase]
        buckets = ", ".join("SUM(CASE WHEN seconds <= %s THEN 1 ELSE 0 END)" for _ in PHASE_BUCKETS)
        # Only constants and placeholders are formatted in; every value is a parameter.
        sql = (
            f"SELECT phase, COUNT(*), SUM(seconds), {buckets} FROM ("  # noqa: S608
            f"  SELECT replica_rollout_id, CASE {' '.join(cases)} END AS phase,"
            f"         SUM(duration_ms) / 1000.0 AS seconds"
            f"  FROM {table} WHERE replica_rollout_id IS NOT NULL"
            f"  GROUP BY 1, 2"
            f") steps WHERE phase IS NOT NULL GROUP BY phase"
        )
        family = HistogramMetricFamily(
            "lora_rollout_phase_duration_seconds",
            "Time one replica spent in a rollout phase: load (load and swap calls), "
            "verify (listing and completion).",
            labels=["phase"],
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*PHASE_BUCKETS, *params])
            for phase, count, total, *counts in cursor.fetchall():
                _histogram(family, [phase], counts, count, total or 0.0, PHASE_BUCKETS)
        yield family

    # -- vLLM HTTP, drift, reconcile ------------------------------------------------

    def _attempts(self, names):
        family = CounterMetricFamily(
            "lora_vllm_http_attempts",
            "HTTP attempts to vLLM replicas by deployment, purpose and status "
            "('error': no response).",
            labels=["deployment", "purpose", "status"],
        )
        totals = defaultdict(int)
        rows = (
            HttpAttempt.objects.filter(replica_rollout__isnull=False)
            .values("replica__deployment_id", "purpose", "status_code")
            .annotate(n=Count("pk"))
        )
        for row in rows:
            status = str(row["status_code"]) if row["status_code"] is not None else "error"
            totals[(names.get(row["replica__deployment_id"], ""), row["purpose"], status)] += row[
                "n"
            ]
        for deployment_id, purpose, status, count in AttemptTally.objects.values_list(
            "deployment_id", "purpose", "status", "count"
        ):
            totals[(names.get(deployment_id, ""), purpose, status)] += count
        # Calls that succeeded and are only counted, not stored: in-sync reconcile
        # polls (on the replica) and /metrics reads (on its LoRA state).
        for row in Replica.objects.values("deployment_id").annotate(n=Sum("in_sync_polls")):
            totals[(names.get(row["deployment_id"], ""), "reconcile_models", "200")] += row["n"]
        reads = ReplicaLoraState.objects.values("replica__deployment_id").annotate(
            n=Sum("ok_reads")
        )
        for row in reads:
            totals[(names.get(row["replica__deployment_id"], ""), "metrics", "200")] += row["n"]
        for labels, count in sorted(totals.items()):
            family.add_metric(list(labels), count)
        yield family

    def _drift(self, names):
        family = CounterMetricFamily(
            "lora_drift_events",
            "Differences between desired and actual state that reconcile found, by kind.",
            labels=["deployment", "kind"],
        )
        # A drift seen again on later ticks is one row with a count.
        for row in DriftEvent.objects.values("deployment_id", "kind").annotate(n=Sum("count")):
            family.add_metric([names.get(row["deployment_id"], ""), row["kind"]], row["n"])
        yield family

    def _reconcile(self, names):
        runs = CounterMetricFamily(
            "lora_reconcile_runs", "Reconciles by outcome.", labels=["deployment", "outcome"]
        )
        duration = HistogramMetricFamily(
            "lora_reconcile_duration_seconds",
            "Duration of one reconcile of a deployment (every replica, repairs included).",
            labels=["deployment"],
        )
        last = GaugeMetricFamily(
            "lora_reconcile_last_success_timestamp_seconds",
            "When the deployment was last reconciled to the end (Unix time).",
            labels=["deployment"],
        )
        for stats in ReconcileStats.objects.all():
            deployment = names.get(stats.deployment_id, "")
            runs.add_metric([deployment, "ok"], stats.runs - stats.failures)
            runs.add_metric([deployment, "error"], stats.failures)
            counts = list(stats.duration_buckets or []) + [0] * (len(RECONCILE_BUCKETS) + 1)
            cumulative, acc = [], 0
            for count in counts[: len(RECONCILE_BUCKETS)]:
                acc += count
                cumulative.append(acc)
            _histogram(
                duration,
                [deployment],
                cumulative,
                stats.runs,
                stats.duration_seconds_sum,
                RECONCILE_BUCKETS,
            )
            if stats.last_success_at:
                last.add_metric([deployment], stats.last_success_at.timestamp())
        yield runs
        yield duration
        yield last

    def _replicas_and_adapters(self, names):
        replicas = GaugeMetricFamily(
            "lora_replicas",
            "Active replicas of each deployment by health (up, down, unknown).",
            labels=["deployment", "state"],
        )
        desired = GaugeMetricFamily(
            "lora_adapters_desired",
            "Adapters each deployment is meant to serve.",
            labels=["deployment"],
        )
        loaded = GaugeMetricFamily(
            "lora_adapters_loaded",
            "Adapters a replica listed in /v1/models at the last reconcile.",
            labels=["deployment", "replica"],
        )
        missing = GaugeMetricFamily(
            "lora_adapters_missing",
            "Desired adapters a replica did not serve from the desired path at the last reconcile.",
            labels=["deployment", "replica"],
        )
        wanted = defaultdict(dict)
        for served in (
            ServedAdapter.objects.filter(version__isnull=False)
            .only(
                "deployment_id",
                "adapter__served_name",
                "served_path",
                "version_id",
                "min_replicas",
                "max_replicas",
                "placement",
                "kept_copy",
            )
            .select_related("adapter")
        ):
            # (its path, the replicas placement puts it on (None: every one), the
            # copies of the version before a swap keeps for a rollback: not missing)
            wanted[served.deployment_id][served.adapter.served_name] = (
                served.served_path,
                placed_keys(served),
                KeptCopy.from_dict(served.kept_copy),
            )
        health = defaultdict(lambda: defaultdict(int))
        for replica in Replica.objects.filter(active=True).only(
            "deployment_id", "base_url", "health", "loaded_adapters"
        ):
            deployment = names.get(replica.deployment_id, "")
            health[deployment][replica.health] += 1
            roots = loaded_adapters(replica)
            loaded.add_metric([deployment, replica.base_url], len(roots))
            if replica.health == ReplicaHealth.UP:
                now = time.time()
                absent = sum(
                    1
                    for name, (path, placed, kept) in wanted[replica.deployment_id].items()
                    if (placed is None or replica.pk in placed)
                    and classify_kept(
                        path,
                        roots.get(name),
                        replica.health,
                        kept=kept.keeps(replica.pk, roots.get(name), now),
                    )
                    not in (SyncState.IN_SYNC, SyncState.KEPT)
                )
                missing.add_metric([deployment, replica.base_url], absent)
        for deployment_id, deployment in names.items():
            for state in ("up", "down", "unknown"):
                replicas.add_metric([deployment, state], health[deployment][state])
            desired.add_metric([deployment], len(wanted[deployment_id]))
        yield replicas
        yield desired
        yield loaded
        yield missing

    # -- registry and MLflow mirror ------------------------------------------------------

    def _registry(self):
        versions = GaugeMetricFamily(
            "lora_versions",
            "Adapter versions by department and status.",
            labels=["department", "status"],
        )
        pending = GaugeMetricFamily(
            "lora_pending_reviews",
            "Items waiting for a second person: versions to review, promotions to approve.",
            labels=["kind"],
        )
        pending_versions = 0
        for row in AdapterVersion.objects.values("adapter__department__slug", "status").annotate(
            n=Count("pk")
        ):
            versions.add_metric([row["adapter__department__slug"], row["status"]], row["n"])
            if row["status"] == VersionStatus.PENDING_REVIEW:
                pending_versions += row["n"]
        pending.add_metric(["version"], pending_versions)
        pending.add_metric(
            ["promotion"], Promotion.objects.filter(status=PromotionStatus.PENDING_APPROVAL).count()
        )
        yield versions
        yield pending

    def _mirror(self, now):
        backlog = GaugeMetricFamily(
            "lora_mlflow_mirror_backlog",
            "MLflow mirror rows not in sync, by kind (version, alias) and state (pending, failed).",
            labels=["kind", "state"],
        )
        lag = GaugeMetricFamily(
            "lora_mlflow_mirror_lag_seconds",
            "Age of the oldest change not yet mirrored to MLflow (0 when in sync).",
            labels=["kind"],
        )
        for kind, model in (("version", MlflowVersionMirror), ("alias", MlflowAliasMirror)):
            row = model.objects.exclude(state=MirrorState.SYNCED).aggregate(
                pending=Count("pk", filter=Q(state=MirrorState.PENDING)),
                failed=Count("pk", filter=Q(state=MirrorState.FAILED)),
                oldest=Min("updated_at"),
            )
            backlog.add_metric([kind, "pending"], row["pending"])
            backlog.add_metric([kind, "failed"], row["failed"])
            oldest = row["oldest"]
            lag.add_metric([kind], max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
        yield backlog
        yield lag

    # -- what vLLM says --------------------------------------------------------------------

    def _activity(self, names, now):
        last = GaugeMetricFamily(
            "lora_adapter_last_active_timestamp_seconds",
            "When vLLM last reported requests for the adapter on the deployment (Unix time).",
            labels=["deployment", "adapter"],
        )
        samples = CounterMetricFamily(
            "lora_adapter_active_samples",
            "Readings of vLLM's lora_requests_info that showed the adapter with requests running.",
            labels=["deployment", "adapter"],
        )
        idle = GaugeMetricFamily(
            "lora_adapter_idle",
            "1 when a served adapter has not been seen active for "
            f"{settings.OBSERVABILITY_IDLE_DAYS:g} days.",
            labels=["deployment", "adapter"],
        )
        seen = {}
        for activity in AdapterActivity.objects.all():
            labels = [names.get(activity.deployment_id, ""), activity.served_name]
            last.add_metric(labels, activity.last_active_at.timestamp())
            samples.add_metric(labels, activity.active_samples)
            seen[(activity.deployment_id, activity.served_name)] = activity.last_active_at
        threshold = now - timedelta(days=settings.OBSERVABILITY_IDLE_DAYS)
        for deployment_id, served_name, since in ServedAdapter.objects.filter(
            version__isnull=False
        ).values_list("deployment_id", "adapter__served_name", "updated_at"):
            active = seen.get((deployment_id, served_name)) or since
            idle.add_metric(
                [names.get(deployment_id, ""), served_name], 1.0 if active < threshold else 0.0
            )
        running = GaugeMetricFamily(
            "lora_vllm_running_adapters",
            "Adapters with requests running on the replica at vLLM's newest lora_requests_info.",
            labels=["deployment", "replica"],
        )
        waiting = GaugeMetricFamily(
            "lora_vllm_waiting_adapters",
            "Adapters with requests waiting for a LoRA slot on the replica.",
            labels=["deployment", "replica"],
        )
        max_lora = GaugeMetricFamily(
            "lora_vllm_max_loras",
            "vLLM's max_loras as the replica reports it.",
            labels=["deployment", "replica"],
        )
        peak = GaugeMetricFamily(
            "lora_vllm_peak_running_adapters",
            "Most adapters seen running at once on the replica.",
            labels=["deployment", "replica"],
        )
        for state in ReplicaLoraState.objects.filter(replica__active=True, ok=True).values(
            "replica__deployment_id",
            "replica__base_url",
            "running",
            "waiting",
            "max_lora",
            "peak_running",
        ):
            labels = [names.get(state["replica__deployment_id"], ""), state["replica__base_url"]]
            running.add_metric(labels, len(state["running"] or []))
            waiting.add_metric(labels, len(state["waiting"] or []))
            peak.add_metric(labels, state["peak_running"])
            if state["max_lora"] is not None:
                max_lora.add_metric(labels, state["max_lora"])
        yield from (last, samples, idle, running, waiting, max_lora, peak)

    def _pool(self, names):
        pool = GaugeMetricFamily(
            "lora_pool_bytes",
            "GPU memory vLLM preallocates for the LoRA pool (planner model, per replica).",
            labels=["deployment"],
        )
        budget = GaugeMetricFamily(
            "lora_pool_budget_bytes",
            "The deployment's lora_memory_share of GPU memory (absent without gpu_memory_bytes).",
            labels=["deployment"],
        )
        for deployment_id, figures in deployment_pool_figures().items():
            if figures.pool_bytes is not None:
                pool.add_metric([names.get(deployment_id, "")], figures.pool_bytes)
            if figures.budget_bytes is not None:
                budget.add_metric([names.get(deployment_id, "")], figures.budget_bytes)
        yield pool
        yield budget


def control_plane_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlPlaneCollector())
    return registry
