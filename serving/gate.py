"""The compatibility gate: every check that must pass before an adapter
version touches a deployment's vLLM replicas.

vLLM accepts a same-shaped adapter trained for another model and serves
garbage (it never checks base_model_name_or_path), so the base-model check
here is the only line of defence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from registry.models import AdapterVersion
from serving.capacity import cold_load, pool_figures
from serving.models import Deployment, Rollout, RolloutKind, ServedAdapter
from serving.rules.base_models import EMBEDDING_MODULES, KNOWN_ARCHITECTURES
from serving.rules.placement_plan import Wish, placements_needed
from serving.rules.transitions import ROLLOUT_TERMINAL


@dataclass(frozen=True)
class GateCheck:
    name: str
    ok: bool
    message: str
    # A failed advisory check is reported but does not refuse the promotion.
    advisory: bool = False


@dataclass(frozen=True)
class GateReport:
    checks: tuple[GateCheck, ...]

    @property
    def passed(self) -> bool:
        return all(c.ok or c.advisory for c in self.checks)

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.ok and not c.advisory]

    def as_list(self) -> list[dict]:
        return [asdict(c) for c in self.checks]


def _normalise(name: str) -> str:
    return name.strip().rstrip("/").lower()


def check_base_model(deployment: Deployment, version: AdapterVersion) -> GateCheck:
    accepted = {_normalise(deployment.base_model_name)} | {
        _normalise(alias) for alias in deployment.base_model_aliases or []
    }
    claimed = version.base_model_name_or_path or version.adapter.base_model
    if _normalise(claimed) in accepted:
        return GateCheck(
            "base_model", True, f"Trained for {claimed}, which this deployment serves."
        )
    return GateCheck(
        "base_model",
        False,
        f"The adapter was trained for {claimed!r}, but {deployment.name} serves "
        f"{deployment.base_model_name!r}. vLLM would load it and answer with garbage.",
    )


def check_rank(deployment: Deployment, version: AdapterVersion) -> GateCheck:
    ranks = [version.r, *[int(r) for r in (version.rank_pattern or {}).values()]]
    top = max(ranks)
    if top <= deployment.max_lora_rank:
        return GateCheck("rank", True, f"Rank {top} fits max_lora_rank {deployment.max_lora_rank}.")
    return GateCheck(
        "rank",
        False,
        f"Rank {top} exceeds the deployment's max_lora_rank {deployment.max_lora_rank}.",
    )


def check_target_modules(deployment: Deployment, version: AdapterVersion) -> GateCheck:
    known = set(deployment.module_dims or {})
    if not known:
        return GateCheck(
            "target_modules",
            False,
            f"The deployment does not know the modules of architecture "
            f"{deployment.architecture or 'unknown'}; enter module_dims for it.",
        )
    missing = sorted(set(version.target_modules) - known)
    embeddings = [m for m in missing if m in EMBEDDING_MODULES]
    if embeddings and deployment.architecture in KNOWN_ARCHITECTURES:
        return GateCheck(
            "target_modules",
            False,
            f"The adapter adapts {', '.join(embeddings)}, but vLLM serves no LoRA on the "
            f"embeddings or the output head of {deployment.architecture}. Retrain without "
            f"{', '.join(embeddings)} in target_modules.",
        )
    if missing:
        return GateCheck(
            "target_modules",
            False,
            f"Target modules {', '.join(missing)} do not exist in {deployment.architecture}. "
            "Retrain with target_modules the base model has.",
        )
    return GateCheck("target_modules", True, "Every target module exists in the architecture.")


def check_shapes(deployment: Deployment, version: AdapterVersion) -> GateCheck:
    dims = deployment.module_dims or {}
    problems = []
    for shape in version.module_shapes or []:
        expected = dims.get(shape["module"])
        if expected is None:
            continue
        if [shape["in_features"], shape["out_features"]] != list(expected):
            problems.append(
                f"{shape['module']} is {shape['in_features']}x{shape['out_features']}, "
                f"the model has {expected[0]}x{expected[1]}"
            )
    if deployment.num_layers and version.layer_count > deployment.num_layers:
        problems.append(
            f"the adapter has {version.layer_count} layers, the model {deployment.num_layers}"
        )
    if problems:
        return GateCheck("shapes", False, "Tensor shapes do not fit: " + "; ".join(problems) + ".")
    return GateCheck("shapes", True, "Tensor shapes fit the base model's dimensions.")


def _registered_adapter_ids(deployment: Deployment, version: AdapterVersion) -> list[int]:
    """Adapters the deployment would serve once this version is promoted: those it
    serves, those whose first rollout is still under way (promotions enqueued in a
    burst each see the others), and this one. A new version of an adapter already
    served takes its place, not a new one."""
    served = ServedAdapter.objects.filter(deployment=deployment, version__isnull=False)
    arriving = Rollout.objects.filter(deployment=deployment, kind=RolloutKind.PROMOTE).exclude(
        status__in=ROLLOUT_TERMINAL
    )
    # One statement, so one snapshot: as two queries, a rollout that succeeded in
    # between (served now, terminal now) was in neither, and a burst could pass
    # the limit by one.
    both = (
        served.order_by()
        .values_list("adapter_id", flat=True)
        .union(arriving.order_by().values_list("adapter_id", flat=True))
    )
    others = set(both) - {version.adapter_id}
    return [*sorted(others), version.adapter_id]


def check_capacity(
    deployment: Deployment, version: AdapterVersion, registered: list[int] | None = None
) -> GateCheck:
    """Only the deployment's own limit on registered adapters refuses: vLLM serves
    any number above max_cpu_loras (check_host_cache says what that costs).
    `registered`: _registered_adapter_ids, where the caller read it already."""
    if registered is None:
        registered = _registered_adapter_ids(deployment, version)
    needed = len(registered)
    limit = deployment.max_registered_adapters
    if needed <= limit:
        return GateCheck(
            "capacity", True, f"{needed} of {limit} registered adapters (max_registered_adapters)."
        )
    return GateCheck(
        "capacity",
        False,
        f"{needed} adapters would exceed {deployment.name}'s limit of {limit} registered "
        "adapters (max_registered_adapters): retire one, or raise the limit.",
    )


def _placement_wishes(
    deployment: Deployment, version: AdapterVersion, adapter_ids: list[int]
) -> tuple[list[Wish], Wish]:
    """The bounds of every adapter the deployment would serve with this version
    (`adapter_ids`, serving.rules.placement_plan), the version's own last: an adapter
    without a ServedAdapter row yet has none (every replica)."""
    bounds = {
        row["adapter_id"]: (row["min_replicas"], row["max_replicas"])
        for row in ServedAdapter.objects.filter(
            deployment=deployment, adapter_id__in=adapter_ids
        ).values("adapter_id", "min_replicas", "max_replicas")
    }
    wishes = {
        pk: Wish(name=str(pk), min_replicas=low, max_replicas=high)
        for pk, (low, high) in ((pk, bounds.get(pk, (None, None))) for pk in adapter_ids)
    }
    mine = wishes.pop(version.adapter_id)
    return [*wishes.values(), mine], mine


def _replica_count(deployment: Deployment) -> int:
    active = deployment.replicas.filter(active=True).count()
    # Before the first reconcile, a static list says how many there will be.
    return active or len(deployment.replica_urls or []) or 1


def check_host_cache(
    deployment: Deployment, version: AdapterVersion, registered: list[int] | None = None
) -> GateCheck:
    """The deployment's total host cache (every replica's max_cpu_loras) against
    the placements its adapters need (serving.rules.placement_plan: an adapter without
    bounds is on every replica, a bounded one on at least its min_replicas).

    An adapter without bounds above it still works: vLLM evicts the least
    recently used adapter from host memory and re-reads it from its lora_path on
    its next request (how hundreds of adapters are served), so that is only said.
    A bounded adapter is never placed past a replica's host cache: without room
    it would not be served at all, so that refuses."""
    if registered is None:
        registered = _registered_adapter_ids(deployment, version)
    wishes, mine = _placement_wishes(deployment, version, registered)
    replicas = _replica_count(deployment)
    cached = deployment.max_cpu_loras
    if not any(w.bounded for w in wishes):
        # Every adapter on every replica: the total is one replica's, times the replicas.
        needed = len(wishes)
        if needed <= cached:
            return GateCheck(
                "host_cache",
                True,
                f"{needed} of {cached} adapters in vLLM's host cache (max_cpu_loras): "
                "none is re-read from disk.",
                advisory=True,
            )
        return GateCheck(
            "host_cache",
            False,
            f"{needed} adapters registered, {cached} cached in host memory (max_cpu_loras): "
            f"a request to an evicted adapter waits while vLLM re-reads it from disk; "
            f"{cold_load(deployment).describe()}.",
            advisory=True,
        )
    needed = placements_needed(wishes, replicas)
    per_replica = deployment.placement_capacity or cached
    total = replicas * per_replica
    limit = (
        f"placement_capacity {per_replica}"
        if deployment.placement_capacity
        else f"max_cpu_loras {cached}"
    )
    figures = (
        f"{needed} placements needed, {total} in the host caches of {replicas} replica(s) x {limit}"
    )
    if needed <= total:
        return GateCheck("host_cache", True, f"{figures}: every one has room.", advisory=True)
    if mine.bounded:
        return GateCheck(
            "host_cache",
            False,
            f"{figures}: no room. Placement never fills a replica past that, so "
            "this adapter would not be served: lower min_replicas/max_replicas, retire an "
            "adapter, or add replicas.",
        )
    return GateCheck(
        "host_cache",
        False,
        f"{figures}: adapters without bounds are re-read from disk when evicted; "
        f"{cold_load(deployment).describe()}. Adapters with bounds may find no room.",
        advisory=True,
    )


def check_memory(deployment: Deployment, version: AdapterVersion) -> GateCheck:
    """vLLM preallocates max_loras slots at max_lora_rank for every LoRA-capable
    module (serving.rules.planner), whatever the adapters: a pool over the
    deployment's share of GPU memory starves the KV cache, so it refuses."""
    figures = pool_figures(deployment)
    if figures.pool_bytes is None:
        return GateCheck(
            "memory",
            True,
            "LoRA pool unknown: the deployment does not give the base model's dimensions.",
            advisory=True,
        )
    pool = (
        f"LoRA pool {figures.pool_bytes} bytes ({deployment.max_loras} slots x "
        f"{figures.slot_bytes} bytes at max_lora_rank {deployment.max_lora_rank})"
    )
    if figures.budget_bytes is None or not deployment.gpu_memory_bytes:
        return GateCheck("memory", True, f"{pool}; GPU memory not configured.", advisory=True)
    share = figures.pool_bytes / deployment.gpu_memory_bytes
    budget = (
        f"{share:.1%} of GPU memory {deployment.gpu_memory_bytes} bytes, budget "
        f"{deployment.lora_memory_share:.0%} = {figures.budget_bytes} bytes"
    )
    if figures.over:
        return GateCheck(
            "memory",
            False,
            f"{pool} is {budget}: lower max_loras or max_lora_rank, or raise lora_memory_share.",
        )
    return GateCheck("memory", True, f"{pool} is {budget}.")


CHECKS = (
    check_base_model,
    check_rank,
    check_target_modules,
    check_shapes,
    check_capacity,
    check_host_cache,
    check_memory,
)


# The checks that count the adapters the deployment would serve.
COUNTING = (check_capacity, check_host_cache)


def evaluate_gate(deployment: Deployment, version: AdapterVersion) -> GateReport:
    # Those adapters read once for both counting checks: one UNION statement,
    # the dearest of the gate's, on every promotion's API call.
    registered = _registered_adapter_ids(deployment, version)
    return GateReport(
        checks=tuple(
            check(deployment, version, registered)
            if check in COUNTING
            else check(deployment, version)
            for check in CHECKS
        )
    )
