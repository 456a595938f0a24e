"""Reading what a vLLM replica says about its LoRA adapters in /metrics.

- `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`
  (every vLLM with --enable-lora): the value is the time vLLM recorded that
  label set, and old label sets stay exported, so only the newest series is
  the current state. It lists adapters with requests in flight, not what is
  resident.
- Newer vLLM (PRs #54830/#54833) adds residency: `vllm:lora_adapter_loaded
  {adapter_name, level="gpu"|"cpu"}`, `vllm:num_gpu_loaded_lora_adapters`,
  `vllm:max_gpu_lora_adapters`. Read where present.

The body is outside input: it is read with a byte cap and a total deadline,
and parsed with prometheus_client's parser. No Django here; the caller
records the attempt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import requests
from prometheus_client.parser import text_string_to_metric_families

from serving.probe import OwnRequests
from serving.vllm_client import TRANSIENT_STATUS, AttemptResult

LORA_INFO = "vllm:lora_requests_info"
ADAPTER_LOADED = "vllm:lora_adapter_loaded"
NUM_GPU_LOADED = "vllm:num_gpu_loaded_lora_adapters"
MAX_GPU_ADAPTERS = "vllm:max_gpu_lora_adapters"


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

    def since(self, after: float | None) -> tuple[LoraSeries, ...]:
        """The label sets that were current after `after` (all of them for None)."""
        return tuple(s for s in self.series if after is None or s.timestamp > after)

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.running, *self.waiting)))


def clients_only(
    series: tuple[LoraSeries, ...], own: OwnRequests | None, after: float | None
) -> tuple[LoraSeries, ...]:
    """The label sets among `series` (those current since `after`) that show
    clients' requests, given what the control plane itself just asked that
    replica (serving.probe.OwnRequests). A set of probed adapters only is the
    probes' if the read just before them did not show it as current since
    `after`; if it did, a client was there first: it is kept, with the stamp
    that read saw. A client's request for a probed adapter while the probes
    ran is missed (the same series). Idle and mixed sets stay as they are."""
    if own is None or own.before is None or not own.names:
        return series
    kept = []
    for s in series:
        listed = {*s.running, *s.waiting}
        if not listed or not listed <= own.names:
            kept.append(s)
            continue
        stamp = own.before.get((s.running, s.waiting))
        if stamp is not None and (after is None or stamp > after):
            kept.append(LoraSeries(s.running, s.waiting, stamp))
    return tuple(kept)


def demand_units(series: tuple[LoraSeries, ...]) -> dict[str, int]:
    """Per adapter, what placement counts as its demand on one replica over
    these label sets: 1 if one listed it running, 1 more if one listed it
    waiting (vLLM 0.32 lists names, not request counts)."""
    units: dict[str, int] = {}
    running = {name for s in series for name in s.running}
    waiting = {name for s in series for name in s.waiting}
    for name in running | waiting:
        units[name] = (name in running) + (name in waiting)
    return units


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
    if newest is None:
        return LoraSnapshot(
            gpu_loaded=tuple(gpu) if residency else None,
            cpu_loaded=tuple(cpu) if residency else None,
            num_gpu_loaded=num_gpu,
            max_gpu_adapters=max_gpu,
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
    )


def fetch_metrics(
    base_url: str,
    *,
    api_key: str | None,
    timeout: float,
    max_bytes: int,
    session: requests.Session | None = None,
) -> tuple[AttemptResult, str | None]:
    """GET <base_url>/metrics: one attempt, the body (None on failure). The
    whole exchange, headers to last byte, must end within `timeout` seconds."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    # Uncompressed: the byte cap then bounds what is parsed (no gzip bomb).
    headers = {"Accept": "text/plain", "Accept-Encoding": "identity"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    http = session or requests.Session()

    def result(status: int | None, ok: bool, error: str = "", transient: bool = False):
        return AttemptResult(
            method="GET",
            url=url,
            started_at=started_at,
            duration_ms=(time.perf_counter() - t0) * 1000,
            status_code=status,
            ok=ok,
            error=error,
            transient=transient,
            body="",
        )

    try:
        with http.get(url, headers=headers, timeout=(timeout, timeout), stream=True) as response:
            if response.status_code != 200:
                status = response.status_code
                return result(status, False, f"HTTP {status}", status in TRANSIENT_STATUS), None
            chunks, size = [], 0
            # read1 returns what has arrived: a trickling body meets the deadline check.
            while chunk := response.raw.read1(64 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    return result(200, False, f"body larger than {max_bytes} bytes"), None
                if time.perf_counter() - t0 > timeout:
                    return result(200, False, f"body not read within {timeout} s", True), None
                chunks.append(chunk)
    except requests.RequestException as error:
        return result(None, False, f"{type(error).__name__}: {error}"[:2000], True), None
    finally:
        if session is None:
            http.close()
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        return result(200, False, "body is not UTF-8"), None
    return result(200, True), text
