"""What a vLLM replica says about its LoRA adapters in /metrics, parsed.

- `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`
  (every vLLM with --enable-lora): the value is the time vLLM recorded that
  label set, and old label sets stay exported, so only the newest series is
  the current state. It lists adapters with requests in flight, not what is
  resident.
- Newer vLLM (PRs #54830/#54833) adds residency: `vllm:lora_adapter_loaded
  {adapter_name, level="gpu"|"cpu"}`, `vllm:num_gpu_loaded_lora_adapters`,
  `vllm:max_gpu_lora_adapters`. Read where present.

In the same pass, vLLM's token counters (`vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`) and its requests in flight
(`vllm:num_requests_running` + `_waiting`): metering reconciles what the
replica counted against the spans it sent (observability.unmetered).

One parser for both readers: serving (a load waits out an earlier load's
requests; the reconcile tells its probes from clients) and observability
(activity, demand, residency). The body is outside input, parsed with
prometheus_client's parser; a body it cannot read raises MetricsParseError.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from serving.vllm_client import AttemptResult

LORA_INFO = "vllm:lora_requests_info"
ADAPTER_LOADED = "vllm:lora_adapter_loaded"
NUM_GPU_LOADED = "vllm:num_gpu_loaded_lora_adapters"
MAX_GPU_ADAPTERS = "vllm:max_gpu_lora_adapters"
# Counters: the parser names the family without `_total`.
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class MetricsParseError(ValueError):
    pass


@dataclass(frozen=True)
class LoraSeries:
    """One label set of lora_requests_info and the last time it was current."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    timestamp: float


@dataclass(frozen=True)
class LoraSnapshot:
    max_lora: int | None = None
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    # vLLM's clock when it recorded running/waiting; None when no series exists yet.
    timestamp: float | None = None
    gpu_loaded: tuple[str, ...] | None = None
    cpu_loaded: tuple[str, ...] | None = None
    num_gpu_loaded: int | None = None
    max_gpu_adapters: int | None = None
    # Every label set, oldest first. vLLM re-stamps a set each time it is current, so
    # a request that started and finished between two reads still leaves its set here.
    series: tuple[LoraSeries, ...] = ()
    # vLLM's token counters since it started, summed over its label sets (None:
    # not exported), and its requests running or waiting when read.
    prompt_tokens_total: int | None = None
    generation_tokens_total: int | None = None
    requests_in_flight: int | None = None

    def since(self, after: float | None) -> tuple[LoraSeries, ...]:
        """The label sets that were current after `after` (all of them for None)."""
        return tuple(s for s in self.series if after is None or s.timestamp > after)

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.running, *self.waiting)))


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(name for name in (part.strip() for part in (value or "").split(",")) if name)


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None


def parse_lora_metrics(text: str) -> LoraSnapshot:
    """The LoRA state in a /metrics body (Prometheus text format)."""
    newest = None
    series: list[LoraSeries] = []
    gpu: list[str] = []
    cpu: list[str] = []
    residency = False
    num_gpu = max_gpu = None
    totals: dict[str, int] = {}
    in_flight: int | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as error:
        raise MetricsParseError(f"not Prometheus text: {error}") from error
    for family in families:
        # The parser strips a counter's _total, never the colon-prefixed names used here.
        if family.name == LORA_INFO:
            for sample in family.samples:
                series.append(
                    LoraSeries(
                        running=_names(sample.labels.get("running_lora_adapters")),
                        waiting=_names(sample.labels.get("waiting_lora_adapters")),
                        timestamp=float(sample.value),
                    )
                )
                if newest is None or sample.value > newest.value:
                    newest = sample
        elif family.name == ADAPTER_LOADED:
            residency = True
            for sample in family.samples:
                name = sample.labels.get("adapter_name") or sample.labels.get("lora_name")
                if not name or sample.value < 1:
                    continue
                (cpu if sample.labels.get("level") == "cpu" else gpu).append(name)
        elif family.name == NUM_GPU_LOADED and family.samples:
            num_gpu = int(family.samples[0].value)
        elif family.name == MAX_GPU_ADAPTERS and family.samples:
            max_gpu = int(family.samples[0].value)
        elif family.name in (PROMPT_TOKENS, GENERATION_TOKENS):
            totals[family.name] = int(
                sum(s.value for s in family.samples if s.name.endswith("_total"))
            )
        elif family.name in IN_FLIGHT:
            in_flight = (in_flight or 0) + int(sum(s.value for s in family.samples))
    prompt_total, generation_total = totals.get(PROMPT_TOKENS), totals.get(GENERATION_TOKENS)
    if newest is None:
        return LoraSnapshot(
            gpu_loaded=tuple(gpu) if residency else None,
            cpu_loaded=tuple(cpu) if residency else None,
            num_gpu_loaded=num_gpu,
            max_gpu_adapters=max_gpu,
            prompt_tokens_total=prompt_total,
            generation_tokens_total=generation_total,
            requests_in_flight=in_flight,
        )
    return LoraSnapshot(
        max_lora=_int(newest.labels.get("max_lora")),
        running=_names(newest.labels.get("running_lora_adapters")),
        waiting=_names(newest.labels.get("waiting_lora_adapters")),
        timestamp=float(newest.value),
        gpu_loaded=tuple(gpu) if residency else None,
        cpu_loaded=tuple(cpu) if residency else None,
        num_gpu_loaded=num_gpu,
        max_gpu_adapters=max_gpu,
        series=tuple(sorted(series, key=lambda s: s.timestamp)),
        prompt_tokens_total=prompt_total,
        generation_tokens_total=generation_total,
        requests_in_flight=in_flight,
    )


def snapshot_of(result: AttemptResult) -> LoraSnapshot | None:
    """The LoRA state in an answered GET /metrics; None where the answer
    cannot tell (not answered, not text, not Prometheus text)."""
    if not result.ok or not isinstance(result.body, str):
        return None
    try:
        return parse_lora_metrics(result.body)
    except MetricsParseError:
        return None
