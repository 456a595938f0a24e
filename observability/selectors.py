"""Reads: a deployment's planner input and when its adapters were last used
(the LoRA pool against its budget is serving.capacity's). Visibility of deployments and adapters is
decided by the callers (serving.selectors, registry.selectors)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from observability.models import AdapterActivity, ReplicaLoraState
from serving.capacity import (
    SHAPE_FIELDS,
    PoolFigures,
    Residency,
    deployment_shape,
    pool_figures,
)
from serving.models import Deployment, ServedAdapter
from serving.planner import (
    LLAMA_MODULES,
    PlanInput,
    PlannerInputError,
)


def deployment_pool_figures() -> dict[int, PoolFigures]:
    """Every deployment's pool and budget, in one query."""
    return {d.pk: pool_figures(d) for d in Deployment.objects.all()}


@dataclass(frozen=True)
class ObservedConcurrency:
    peak_running: int | None
    waiting_seen: bool
    samples: int


def observed_concurrency(deployment: Deployment) -> ObservedConcurrency:
    rows = list(
        ReplicaLoraState.objects.filter(replica__deployment=deployment).values_list(
            "peak_running", "waiting_samples", "samples"
        )
    )
    samples = sum(r[2] for r in rows)
    if not samples:
        return ObservedConcurrency(None, False, 0)
    return ObservedConcurrency(
        peak_running=max(r[0] for r in rows),
        waiting_seen=any(r[1] for r in rows),
        samples=samples,
    )


def deployment_plan_input(deployment: Deployment, **overrides) -> PlanInput:
    """The planner's input filled from a deployment's configuration and what
    its replicas reported; `overrides` win (what the planner page's form says)."""
    shape = deployment_shape(deployment)
    if shape is None:
        missing = [name for name in SHAPE_FIELDS if not getattr(deployment, name)]
        raise PlannerInputError({name: "not set on the deployment" for name in missing})
    observed = observed_concurrency(deployment)
    values = {
        "model": shape,
        "gpu_memory_bytes": deployment.gpu_memory_bytes or 0,
        "gpu_memory_utilization": settings.PLANNER_GPU_MEMORY_UTILIZATION,
        "max_loras": deployment.max_loras,
        "max_cpu_loras": deployment.max_cpu_loras,
        "max_lora_rank": deployment.max_lora_rank,
        "target_modules": tuple(m for m in LLAMA_MODULES if m in shape.linear_modules()),
        "context_length": settings.PLANNER_CONTEXT_LENGTH,
        "use_cases": max(1, deployment.served_adapters.filter(version__isnull=False).count()),
        "lora_memory_share": deployment.lora_memory_share,
        "observed_peak_adapters": observed.peak_running,
        "observed_waiting": observed.waiting_seen,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return PlanInput(**values)


@dataclass(frozen=True)
class Usage:
    """How an adapter is used on one deployment, for the pages."""

    deployment: str
    last_active_at: datetime | None
    active_samples: int
    served_since: datetime | None
    active_now: bool
    idle: bool

    @property
    def idle_since(self) -> datetime | None:
        return self.last_active_at or self.served_since


def _active_window() -> timedelta:
    # vLLM re-stamps its series every engine step while requests run; an idle
    # engine keeps its last label set, stamped when it went idle.
    return timedelta(seconds=2 * settings.SERVING_RECONCILE_INTERVAL_SECONDS)


def adapter_usage(adapter) -> list[Usage]:
    """Every deployment that serves the adapter or has seen it active, in one
    query (plus one for "active now" when it was ever seen)."""
    now = timezone.now()
    threshold = now - timedelta(days=settings.OBSERVABILITY_IDLE_DAYS)
    activity = AdapterActivity.objects.filter(deployment=OuterRef("pk"), adapter=adapter)
    served = ServedAdapter.objects.filter(
        deployment=OuterRef("pk"), adapter=adapter, version__isnull=False
    )
    rows = list(
        Deployment.objects.annotate(
            since=Subquery(served.values("updated_at")[:1]),
            last=Subquery(activity.values("last_active_at")[:1]),
            samples=Subquery(activity.values("active_samples")[:1]),
        )
        .filter(Q(since__isnull=False) | Q(last__isnull=False))
        .order_by("name")
        .values("name", "since", "last", "samples")
    )
    seen = {row["name"] for row in rows if row["last"]}
    running_now = _running_now(seen, adapter.served_name) if seen else set()
    return [
        Usage(
            deployment=row["name"],
            last_active_at=row["last"],
            active_samples=row["samples"] or 0,
            served_since=row["since"],
            active_now=row["name"] in running_now,
            idle=row["since"] is not None and (row["last"] or row["since"]) < threshold,
        )
        for row in rows
    ]


def _running_now(deployments: set[str], served_name: str) -> set[str]:
    recent = timezone.now() - _active_window()
    result = set()
    for deployment, running, waiting in ReplicaLoraState.objects.filter(
        replica__deployment__name__in=deployments, series_timestamp__gte=recent.timestamp(), ok=True
    ).values_list("replica__deployment__name", "running", "waiting"):
        if served_name in (running or []) or served_name in (waiting or []):
            result.add(deployment)
    return result


def deployment_usage(deployment: Deployment, names: list[str]) -> dict[str, Usage]:
    """{served name: Usage} of the named adapters the deployment serves, in two queries."""
    now = timezone.now()
    threshold = now - timedelta(days=settings.OBSERVABILITY_IDLE_DAYS)
    activity = AdapterActivity.objects.filter(
        deployment=deployment, served_name=OuterRef("adapter__served_name")
    )
    rows = ServedAdapter.objects.filter(
        deployment=deployment, adapter__served_name__in=names, version__isnull=False
    ).annotate(
        last=Subquery(activity.values("last_active_at")[:1]),
        samples=Subquery(activity.values("active_samples")[:1]),
    )
    recent = now - _active_window()
    running: set[str] = set()
    for names_running, names_waiting in ReplicaLoraState.objects.filter(
        replica__deployment=deployment, series_timestamp__gte=recent.timestamp(), ok=True
    ).values_list("running", "waiting"):
        running.update(names_running or [])
        running.update(names_waiting or [])
    result = {}
    for row in rows.values("adapter__served_name", "updated_at", "last", "samples"):
        name = row["adapter__served_name"]
        result[name] = Usage(
            deployment=deployment.name,
            last_active_at=row["last"],
            active_samples=row["samples"] or 0,
            served_since=row["updated_at"],
            active_now=name in running,
            idle=(row["last"] or row["updated_at"]) < threshold,
        )
    return result


def lora_residency(deployments) -> dict[int, Residency]:
    """The residency provider of serving.capacity (registered in ready()): the
    busiest replica's last good reading of vLLM's LoRA metrics, per deployment,
    in one query."""
    rows = ReplicaLoraState.objects.filter(
        replica__deployment__in=[d.pk for d in deployments], replica__active=True, ok=True
    ).values_list(
        "replica__deployment_id", "running", "waiting", "gpu_loaded", "cpu_loaded", "observed_at"
    )
    found: dict[int, Residency] = {}
    for deployment_id, running, waiting, gpu, cpu, observed_at in rows:
        seen = found.get(deployment_id, Residency())
        batch = len(gpu) if gpu is not None else len(running or [])
        found[deployment_id] = Residency(
            batch=max(seen.batch or 0, batch),
            host=seen.host if cpu is None else max(seen.host or 0, len(cpu)),
            waiting=max(seen.waiting or 0, len(waiting or [])),
            observed_at=max(filter(None, (seen.observed_at, observed_at)), default=None),
        )
    return found
