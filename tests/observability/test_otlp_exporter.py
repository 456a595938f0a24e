"""The receiver against the exporter vLLM 0.32 itself uses (the OpenTelemetry
SDK's OTLP/HTTP protobuf exporter from vLLM's virtualenv, gzip and the token in
OTEL_EXPORTER_OTLP_TRACES_HEADERS, as scripts/vllm/serve.sh sets them), on a
live server: a batch is recorded, and a batch whose answer was lost after it
was written (a 503 here) is sent again by the exporter and counted once. No
vLLM server is started; the real one is tests/serving/vllm/test_metering_real.py."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from django.db import DatabaseError

from observability.models import DailyTokens, MeteredRequest
from observability.otlp import metering_token
from tests.support.vllm_servers import vllm_available, vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not vllm_available(), reason="needs vLLM's virtualenv (its exporter)"),
]

EXPORT = """
import sys, time
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
tracer = provider.get_tracer("vllm.llm_engine")
for index, request_id in enumerate(sys.argv[2:]):
    # As vllm/v1/engine/output_processor.py's do_tracing makes it.
    tracer.start_span(
        "llm_request",
        kind=SpanKind.SERVER,
        start_time=time.time_ns(),
        attributes={
            "gen_ai.request.id": request_id,
            "gen_ai.usage.prompt_tokens": 10 + index,
            "gen_ai.usage.completion_tokens": 2,
            "gen_ai.latency.e2e": 0.01,
        },
    ).end()
provider.shutdown()
"""


def export(url: str, token: str, ids: list[str]) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization=Bearer%20{token}",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
        "NO_PROXY": "127.0.0.1",
    }
    return subprocess.run(
        [str(vllm_python()), "-c", EXPORT, url, *ids],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_sdk_exporter_delivers_and_a_lost_answer_counts_once(
    live_server, deployment, monkeypatch
):
    from observability import otlp

    recorded = otlp.metered_spans_record
    calls = []

    def answer_lost_once(target, spans):
        calls.append(recorded(target, spans))
        if len(calls) == 1:
            raise DatabaseError("written, then the connection broke before the answer")
        return calls[-1]

    monkeypatch.setattr(otlp, "metered_spans_record", answer_lost_once)
    ids = [f"chatcmpl-u1.k.v0.{uuid.uuid4()}" for _ in range(5)]
    url = f"{live_server.url}/otlp/{deployment.name}/v1/traces"
    done = export(url, metering_token(deployment.name), ids)
    assert done.returncode == 0, done.stderr[-2000:]
    assert calls == [5, 0]  # written once; the exporter's second send added nothing
    assert set(MeteredRequest.objects.values_list("request_id", flat=True)) == set(ids)
    row = DailyTokens.objects.get()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (5, 60, 10)


def test_the_sdk_exporter_with_another_deployments_token_records_nothing(live_server, deployment):
    url = f"{live_server.url}/otlp/{deployment.name}/v1/traces"
    done = export(url, metering_token("another"), [f"chatcmpl-{uuid.uuid4()}"])
    assert done.returncode == 0
    assert "401" in done.stderr  # the exporter logs the refusal and drops the batch
    assert not MeteredRequest.objects.exists()
