"""Capacity and cost planner: what one vLLM replica's GPU memory holds, and
what consolidating N use cases onto one multi-LoRA deployment saves.

The LoRA pool is modelled the way vLLM 0.32 allocates it (vllm/lora/layers/,
`create_lora_weights`): for each of `max_loras` slots, an A buffer
(max_lora_rank x in) and a B buffer (out x max_lora_rank) for EVERY
LoRA-capable module of every layer (vLLM wraps all linear layers, not just
the ones an adapter targets), plus the embedding (vocab x rank, hidden x rank)
and the LM head's logits processor (rank x hidden, vocab x rank), in the LoRA
dtype (the model's by default). The pool does not depend on how many adapters
are registered or on their actual ranks. bench/lora_pool_memory.py checks this
against a real vLLM.

Pure functions on plain values; no Django here, so the gate, the API, the
pages and `manage.py plan` all compute the same figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
# torch_dtype spellings seen in config.json files.
_DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16"}
VALID_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HOURS_PER_MONTH = 730
# The product document's advice (section 6): 10-15% of VRAM for LoRA weights.
LORA_SHARE_ADVICE = (0.10, 0.15)
# What vLLM schedules in one step by default; activations at start-up are profiled with it.
DEFAULT_BATCHED_TOKENS = 2048
# CUDA context, NCCL and allocator slack that vLLM's profile does not hand to the KV cache.
RUNTIME_RESERVE_BYTES = 512 * 1024**2


class PlannerInputError(ValueError):
    """Bad planner input; `fields` maps each offending field to why."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
        self.fields = fields


def normalise_dtype(value: str) -> str:
    name = str(value or "").lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise PlannerInputError({"dtype": f"unknown dtype {value!r}; one of {sorted(DTYPE_BYTES)}"})
    return name


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs from a base model's config.json."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    dtype: str = "float16"
    head_dim: int | None = None
    parameters: int | None = None  # stated count; computed from the shapes when absent
    tie_word_embeddings: bool = False
    # {module: (in, out)} of every LoRA-capable linear module of one layer.
    modules: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict[str, Any], *, dtype: str | None = None) -> ModelShape:
        """From a Hugging Face config.json (Llama/Mistral/Qwen/Granite layout)."""
        if not isinstance(config, dict):
            raise PlannerInputError({"config": "must be a JSON object (a config.json)"})
        problems: dict[str, str] = {}

        def positive(*names: str, required: bool = True) -> int | None:
            for name in names:
                value = config.get(name)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    problems[f"config.{name}"] = "must be a positive integer"
                    return None
                return value
            if required:
                problems[f"config.{names[0]}"] = "is required"
            return None

        hidden = positive("hidden_size", "d_model")
        intermediate = positive("intermediate_size", "ffn_dim")
        layers = positive("num_hidden_layers", "n_layer", "num_layers")
        heads = positive("num_attention_heads", "n_head")
        kv_heads = positive("num_key_value_heads", required=False) or heads
        vocab = positive("vocab_size")
        head_dim = positive("head_dim", required=False)
        parameters = positive("num_parameters", "n_params", required=False)
        try:
            chosen = normalise_dtype(
                dtype or config.get("torch_dtype") or config.get("dtype") or "float16"
            )
        except PlannerInputError as error:
            problems["config.torch_dtype" if not dtype else "dtype"] = error.fields["dtype"]
            chosen = "float16"
        if problems:
            raise PlannerInputError(problems)
        # positive() put every missing required one in problems.
        assert hidden and intermediate and layers and heads and kv_heads and vocab
        if heads and kv_heads and heads % kv_heads:
            raise PlannerInputError(
                {"config.num_key_value_heads": f"{kv_heads} does not divide {heads} heads"}
            )
        return cls(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=vocab,
            dtype=chosen,
            head_dim=head_dim,
            parameters=parameters,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def linear_modules(self) -> dict[str, tuple[int, int]]:
        """(in, out) of every linear module of one decoder layer."""
        if self.modules:
            return dict(self.modules)
        q = self.num_attention_heads * self.head_size
        kv = self.num_key_value_heads * self.head_size
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameter_count(self) -> int:
        if self.parameters:
            return self.parameters
        per_layer = sum(a * b for a, b in self.linear_modules().values()) + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + head + self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head.
        return (
            2
            * self.num_layers
            * self.num_key_value_heads
            * self.head_size
            * DTYPE_BYTES[self.dtype]
        )


def lora_slot_bytes(model: ModelShape, rank: int, dtype: str | None = None) -> int:
    """One slot of vLLM's preallocated LoRA pool at `rank`."""
    width = DTYPE_BYTES[normalise_dtype(dtype or model.dtype)]
    linear = sum(a + b for a, b in model.linear_modules().values()) * model.num_layers
    # Embedding: A vocab x rank, B hidden x rank; LM head: A rank x hidden, B vocab x rank.
    vocab = 2 * (model.vocab_size + model.hidden_size)
    return rank * (linear + vocab) * width


def lora_pool_bytes(
    model: ModelShape, max_loras: int, max_lora_rank: int, dtype: str | None = None
) -> int:
    return max_loras * lora_slot_bytes(model, max_lora_rank, dtype)


def adapter_bytes(model: ModelShape, rank: int, target_modules: list[str] | tuple[str, ...]) -> int:
    """An adapter of `rank` on `target_modules`, as the CPU cache holds it."""
    modules = model.linear_modules()
    per_layer = sum(a + b for name, (a, b) in modules.items() if name in set(target_modules))
    return rank * per_layer * model.num_layers * DTYPE_BYTES[model.dtype]


@dataclass(frozen=True)
class PlanInput:
    model: ModelShape
    gpu_memory_bytes: int
    gpu_type: str = ""
    gpu_memory_utilization: float = 0.9
    gpus_per_replica: int = 1
    max_loras: int = 4
    max_cpu_loras: int = 8
    max_lora_rank: int = 16
    target_modules: tuple[str, ...] = ()  # empty: every linear module
    context_length: int = 4096
    use_cases: int = 1
    price_per_gpu_hour: float = 0.0
    lora_memory_share: float = LORA_SHARE_ADVICE[1]
    # None: estimated (see activation_reserve_bytes).
    reserve_bytes: int | None = None
    # Concurrency seen by the control plane in vLLM's metrics (item: observed usage).
    observed_peak_adapters: int | None = None
    observed_waiting: bool = False

    def validate(self) -> PlanInput:
        problems: dict[str, str] = {}
        if self.gpu_memory_bytes <= 0:
            problems["gpu_memory_bytes"] = "must be positive"
        if not 0 < self.gpu_memory_utilization <= 1:
            problems["gpu_memory_utilization"] = "must be in (0, 1]"
        for name in (
            "gpus_per_replica",
            "max_loras",
            "max_cpu_loras",
            "context_length",
            "use_cases",
        ):
            if getattr(self, name) < 1:
                problems[name] = "must be at least 1"
        if self.max_lora_rank not in VALID_LORA_RANKS:
            problems["max_lora_rank"] = f"vLLM accepts one of {list(VALID_LORA_RANKS)}"
        if self.max_cpu_loras < self.max_loras:
            problems["max_cpu_loras"] = f"must be >= max_loras ({self.max_loras}), as vLLM requires"
        unknown = sorted(set(self.target_modules) - set(self.model.linear_modules()))
        if unknown:
            problems["target_modules"] = (
                f"{', '.join(unknown)} not in the model's modules "
                f"{', '.join(sorted(self.model.linear_modules()))}"
            )
        if self.price_per_gpu_hour < 0:
            problems["price_per_gpu_hour"] = "must not be negative"
        if not 0 < self.lora_memory_share < 1:
            problems["lora_memory_share"] = "must be in (0, 1)"
        if problems:
            raise PlannerInputError(problems)
        return self


def activation_reserve_bytes(model: ModelShape) -> int:
    """What vLLM's start-up profile keeps for activations and the runtime: a
    step of DEFAULT_BATCHED_TOKENS tokens (hidden states, MLP, fp32 logits)."""
    width = DTYPE_BYTES[model.dtype]
    per_token = (4 * model.hidden_size + 2 * model.intermediate_size) * width + 4 * model.vocab_size
    return DEFAULT_BATCHED_TOKENS * per_token + RUNTIME_RESERVE_BYTES


@dataclass(frozen=True)
class Economics:
    use_cases: int
    dedicated_gpus: int
    dedicated_vram_bytes: int
    dedicated_cost_per_month: float
    shared_gpus: int
    shared_vram_bytes: int
    shared_cost_per_month: float
    saving_per_month: float
    fits_cpu_cache: bool


@dataclass(frozen=True)
class Plan:
    gpu_type: str
    vram_bytes: int
    usable_bytes: int
    base_weights_bytes: int
    parameters: int
    lora_slot_bytes: int
    lora_pool_bytes: int
    cpu_cache_bytes: int
    reserve_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_cache_tokens: int
    concurrent_sequences: int
    lora_share: float
    lora_share_verdict: str
    kv_share: float
    max_loras_within_share: int
    max_loras_recommended: int
    recommendation: str
    economics: Economics
    fits: bool
    warnings: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gpus_for(need_bytes: int, gpu_memory: int, utilization: float) -> int:
    return max(1, math.ceil(need_bytes / (gpu_memory * utilization)))


def plan(spec: PlanInput) -> Plan:
    spec.validate()
    model = spec.model
    width = DTYPE_BYTES[model.dtype]
    vram = spec.gpu_memory_bytes * spec.gpus_per_replica
    usable = int(vram * spec.gpu_memory_utilization)
    parameters = model.parameter_count()
    weights = parameters * width
    slot = lora_slot_bytes(model, spec.max_lora_rank)
    pool = spec.max_loras * slot
    targets = spec.target_modules or tuple(model.linear_modules())
    cpu_cache = spec.max_cpu_loras * adapter_bytes(model, spec.max_lora_rank, targets)
    reserve = activation_reserve_bytes(model) if spec.reserve_bytes is None else spec.reserve_bytes
    kv = max(0, usable - weights - pool - reserve)
    kv_tokens = kv // model.kv_bytes_per_token
    sequences = kv_tokens // spec.context_length
    share = pool / vram
    low, high = LORA_SHARE_ADVICE
    verdict = "below" if share < low else "above" if share > high else "within"
    within_share = int(spec.lora_memory_share * vram // slot) if slot else 0

    warnings = []
    fits = weights + pool + reserve < usable
    if not fits:
        warnings.append(
            f"Weights {weights} + LoRA pool {pool} + reserve {reserve} bytes do not fit the "
            f"usable {usable} bytes; add GPUs per replica or lower max_loras/max_lora_rank."
        )
    elif sequences < 1:
        warnings.append(
            f"The KV cache holds {kv_tokens} tokens: not one sequence of {spec.context_length}."
        )
    if spec.use_cases > spec.max_cpu_loras:
        warnings.append(
            f"{spec.use_cases} use cases exceed max_cpu_loras {spec.max_cpu_loras}: "
            "vLLM will evict and re-read adapters from disk (LRU)."
        )

    recommended, why = _recommend_max_loras(spec, within_share)
    dedicated_per_pod = _gpus_for(
        weights + reserve, spec.gpu_memory_bytes, spec.gpu_memory_utilization
    )
    dedicated = spec.use_cases * max(dedicated_per_pod, 1)
    shared = max(
        spec.gpus_per_replica,
        _gpus_for(weights + pool + reserve, spec.gpu_memory_bytes, spec.gpu_memory_utilization),
    )
    monthly = spec.price_per_gpu_hour * HOURS_PER_MONTH
    economics = Economics(
        use_cases=spec.use_cases,
        dedicated_gpus=dedicated,
        dedicated_vram_bytes=dedicated * spec.gpu_memory_bytes,
        dedicated_cost_per_month=round(dedicated * monthly, 2),
        shared_gpus=shared,
        shared_vram_bytes=shared * spec.gpu_memory_bytes,
        shared_cost_per_month=round(shared * monthly, 2),
        saving_per_month=round((dedicated - shared) * monthly, 2),
        fits_cpu_cache=spec.use_cases <= spec.max_cpu_loras,
    )
    return Plan(
        gpu_type=spec.gpu_type,
        vram_bytes=vram,
        usable_bytes=usable,
        base_weights_bytes=weights,
        parameters=parameters,
        lora_slot_bytes=slot,
        lora_pool_bytes=pool,
        cpu_cache_bytes=cpu_cache,
        reserve_bytes=reserve,
        kv_cache_bytes=kv,
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_cache_tokens=kv_tokens,
        concurrent_sequences=sequences,
        lora_share=round(share, 6),
        lora_share_verdict=verdict,
        kv_share=round(kv / vram, 6),
        max_loras_within_share=within_share,
        max_loras_recommended=recommended,
        recommendation=why,
        economics=economics,
        fits=fits,
        warnings=warnings,
    )


def _recommend_max_loras(spec: PlanInput, within_share: int) -> tuple[int, str]:
    """max_loras from what vLLM reported running at once; never above what the
    deployment's LoRA share of memory allows."""
    cap = max(1, within_share)
    if spec.observed_peak_adapters is None:
        return min(spec.max_loras, cap), (
            "No concurrency observed yet (vLLM's lora_requests_info); keeping max_loras."
        )
    peak = max(1, spec.observed_peak_adapters)
    if spec.observed_waiting and peak >= spec.max_loras:
        wanted = spec.max_loras * 2
        why = (
            f"Requests waited for a LoRA slot with all {spec.max_loras} in use: "
            f"raise max_loras to {min(wanted, cap)}"
        )
        return min(wanted, cap), why + (
            " (capped by the LoRA memory share)." if wanted > cap else "."
        )
    if peak < spec.max_loras:
        return min(peak, cap), (
            f"At most {peak} adapters ran at once; max_loras {peak} frees "
            f"{spec.max_loras - peak} slot(s) of LoRA pool for the KV cache."
        )
    return min(
        spec.max_loras, cap
    ), f"All {spec.max_loras} slots were used at once; keep max_loras."


def with_observed(spec: PlanInput, peak: int | None, waiting: bool) -> PlanInput:
    return replace(spec, observed_peak_adapters=peak, observed_waiting=waiting)
