"""A deployment's LoRA pool (what vLLM preallocates for max_loras slots at
max_lora_rank, serving.rules.planner) against its share of GPU memory, and vLLM's
three tiers: max_loras adapters in one batch, max_cpu_loras in the host cache
(LRU), and every registered one, re-read from its lora_path when evicted."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Count, F, Window
from django.db.models.functions import RowNumber

from serving.models import Deployment, HttpAttempt, ServedAdapter
from serving.rules.base_models import EMBEDDING_MODULES
from serving.rules.planner import ModelShape, lora_pool_bytes, lora_slot_bytes
from serving.sync_state import loaded_adapters

# Fields of Deployment the pool model needs.
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def deployment_shape(deployment: Deployment) -> ModelShape | None:
    """The base model as the deployment describes it; None when a dimension is unknown."""
    values = {name: getattr(deployment, name) for name in SHAPE_FIELDS}
    if not all(values.values()):
        return None
    modules = {
        name: (int(dims[0]), int(dims[1]))
        for name, dims in (deployment.module_dims or {}).items()
        # The planner's modules are one decoder layer's; it sizes the embedding and
        # the head itself, from vocab_size.
        if isinstance(dims, list | tuple) and len(dims) == 2 and name not in EMBEDDING_MODULES
    }
    return ModelShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_layers=values["num_layers"],
        num_attention_heads=values["num_attention_heads"],
        num_key_value_heads=values["num_key_value_heads"],
        vocab_size=values["vocab_size"],
        dtype=settings.SERVING_DTYPE,
        modules=modules,
    )


@dataclass(frozen=True)
class PoolFigures:
    pool_bytes: int | None
    slot_bytes: int | None
    budget_bytes: int | None

    @property
    def over(self) -> bool:
        pool, budget = self.pool_bytes, self.budget_bytes
        return pool is not None and budget is not None and pool > budget


def pool_figures(
    deployment: Deployment, *, max_loras: int | None = None, max_lora_rank: int | None = None
) -> PoolFigures:
    shape = deployment_shape(deployment)
    budget = (
        int(deployment.gpu_memory_bytes * deployment.lora_memory_share)
        if deployment.gpu_memory_bytes
        else None
    )
    if shape is None:
        return PoolFigures(None, None, budget)
    rank = max_lora_rank or deployment.max_lora_rank
    return PoolFigures(
        pool_bytes=lora_pool_bytes(shape, max_loras or deployment.max_loras, rank),
        slot_bytes=lora_slot_bytes(shape, rank),
        budget_bytes=budget,
    )


# --- the three tiers ---------------------------------------------------------------------

# Enough loads for a stable p95, few enough to follow a change of volume or of load.
COLD_LOAD_SAMPLES = 200


def _nearest_rank(ordered: list[float], q: float) -> float:
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class ColdLoad:
    """What a request to an adapter evicted from vLLM's host cache waits for: vLLM
    re-reads it from its lora_path, which costs what a load costs. Predicted from the
    replicas' own successful `POST /v1/load_lora_adapter` attempts (rollouts and
    reconcile repairs alike), the newest COLD_LOAD_SAMPLES of them."""

    samples: int
    median_ms: float | None
    p95_ms: float | None

    @property
    def measured(self) -> bool:
        return self.samples > 0

    def describe(self) -> str:
        if not self.measured:
            return (
                "no load on this deployment's replicas has been measured yet, so the "
                "cold-load latency cannot be predicted until the first one"
            )
        loads = "load" if self.samples == 1 else "loads"
        return (
            f"predicted cold-load latency {self.median_ms:.0f} ms median, "
            f"{self.p95_ms:.0f} ms p95 (from the {self.samples} most recent successful "
            f"{loads} on this deployment's replicas)"
        )


def _cold_load_of(durations: list[float]) -> ColdLoad:
    if not durations:
        return ColdLoad(0, None, None)
    ordered = sorted(durations)
    return ColdLoad(len(ordered), statistics.median(ordered), _nearest_rank(ordered, 95))


def cold_loads(
    deployments: list[Deployment], *, samples: int = COLD_LOAD_SAMPLES
) -> dict[int, ColdLoad]:
    """{deployment id: ColdLoad} in one query, however many deployments. Durations
    only: nothing of any department's adapters."""
    newest = Window(
        RowNumber(),
        partition_by=F("replica__deployment_id"),
        order_by=[F("started_at").desc(), F("id").desc()],
    )
    rows = (
        HttpAttempt.objects.filter(
            replica__deployment__in=[d.pk for d in deployments], purpose="load", ok=True
        )
        .annotate(newest=newest)
        .filter(newest__lte=samples)
        .values_list("replica__deployment_id", "duration_ms")
    )
    durations: dict[int, list[float]] = defaultdict(list)
    for deployment_id, duration_ms in rows:
        durations[deployment_id].append(duration_ms)
    return {d.pk: _cold_load_of(durations[d.pk]) for d in deployments}


def cold_load(deployment: Deployment, *, samples: int = COLD_LOAD_SAMPLES) -> ColdLoad:
    return cold_loads([deployment], samples=samples)[deployment.pk]


@dataclass(frozen=True)
class Residency:
    """What vLLM's /metrics said of one deployment's replicas (the busiest one),
    as observability reads it; None where the replicas do not export it."""

    # Adapters in the running batch: vllm:lora_adapter_loaded{level="gpu"} on newer
    # vLLM, else the running adapters of the newest vllm:lora_requests_info.
    batch: int | None = None
    # Adapters in the host cache: vllm:lora_adapter_loaded{level="cpu"} (newer vLLM only).
    host: int | None = None
    # Adapters with requests waiting for a batch slot.
    waiting: int | None = None
    observed_at: datetime | None = None


@dataclass(frozen=True)
class TierUse:
    name: str  # "batch" | "host" | "registered"
    limit: int
    used: int | None
    how: str  # how `used` is known, in words

    @property
    def percent(self) -> int:
        if self.used is None or not self.limit:
            return 0
        return min(100, round(100 * self.used / self.limit))

    @property
    def over(self) -> bool:
        return self.used is not None and self.used > self.limit


@dataclass(frozen=True)
class Tiers:
    """vLLM's three tiers on one deployment, each with its limit and its use."""

    batch: TierUse
    host: TierUse
    registered: TierUse
    cold_load: ColdLoad

    @property
    def evicting(self) -> bool:
        """More adapters registered than the host cache holds: some are cold."""
        return (self.registered.used or 0) > self.host.limit


ResidencyProvider = Callable[[list[Deployment]], dict[int, Residency]]

# Serving reads no vLLM metrics itself: the app that does (observability) registers
# its reader here from its ready(), explicitly, instead of answering a signal.
_residency_providers: list[ResidencyProvider] = []


def residency_provider_register(provider: ResidencyProvider) -> None:
    """`provider(deployments)` returns {deployment id: Residency} for those whose
    replicas' metrics it has read. Registering the same one again is a no-op."""
    if provider not in _residency_providers:
        _residency_providers.append(provider)


def residency_of(deployments: list[Deployment]) -> dict[int, Residency]:
    """{deployment id: Residency} from whichever registered provider knows it."""
    found: dict[int, Residency] = {}
    for provider in _residency_providers:
        found.update(provider(deployments) or {})
    return found


def tiers_of(
    deployment: Deployment,
    *,
    registered: int,
    loaded: int,
    residency: Residency | None,
    cold: ColdLoad,
) -> Tiers:
    """`registered`: adapters desired on the deployment; `loaded`: the most that one
    replica listed in /v1/models at its last reconcile (every name vLLM knows, resident
    or not)."""
    residency = residency or Residency()
    if residency.batch is not None:
        waiting = f"; {residency.waiting} waiting for a slot" if residency.waiting else ""
        batch = TierUse(
            "batch",
            deployment.max_loras,
            residency.batch,
            f"adapters in the running batch at the last reading of vLLM's /metrics{waiting}",
        )
    else:
        batch = TierUse("batch", deployment.max_loras, None, "not observed: no /metrics reading")
    if residency.host is not None:
        host = TierUse(
            "host", deployment.max_cpu_loras, residency.host, "vLLM's lora_adapter_loaded metric"
        )
    else:
        # vLLM 0.32 does not export residency; its cache fills up to the limit with the
        # adapters loaded most recently, so this is what it holds once warm.
        host = TierUse(
            "host",
            deployment.max_cpu_loras,
            min(loaded, deployment.max_cpu_loras),
            "estimated: the adapters a replica lists, up to max_cpu_loras (LRU)",
        )
    return Tiers(
        batch=batch,
        host=host,
        registered=TierUse(
            "registered",
            deployment.max_registered_adapters,
            registered,
            "adapters promoted to this deployment",
        ),
        cold_load=cold,
    )


def tiers_by_deployment(deployments: list[Deployment]) -> dict[int, Tiers]:
    """{deployment id: Tiers}, over every department (the limits are shared), in a
    fixed number of queries. Replicas are read from `deployment.replicas.all()`, so
    prefetch them."""
    ids = [d.pk for d in deployments]
    registered = dict(
        ServedAdapter.objects.filter(deployment__in=ids, version__isnull=False)
        .values("deployment_id")
        .annotate(n=Count("pk"))
        .values_list("deployment_id", "n")
    )
    residency = residency_of(deployments)
    cold = cold_loads(deployments)
    result = {}
    for d in deployments:
        loaded = max((len(loaded_adapters(r)) for r in d.replicas.all() if r.active), default=0)
        result[d.pk] = tiers_of(
            d,
            registered=registered.get(d.pk, 0),
            loaded=loaded,
            residency=residency.get(d.pk),
            cold=cold[d.pk],
        )
    return result


def deployment_tiers(deployment: Deployment) -> Tiers:
    return tiers_by_deployment([deployment])[deployment.pk]
