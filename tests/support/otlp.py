"""OTLP/HTTP trace bodies as vLLM 0.32's exporter sends them: one
`llm_request` span per request (vllm/v1/engine/output_processor.py)."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span


def llm_span(
    request_id,
    prompt=7,
    completion=3,
    *,
    name="llm_request",
    ended=None,
    span_id=b"\x02" * 8,
    took=0.01,
) -> Span:
    """One span; `span_id` tells apart the spans of a request's `n` choices
    (vLLM gives each its own, with the same request id)."""
    ended = ended if ended is not None else time.time()
    attributes = [KeyValue(key="gen_ai.latency.e2e", value=AnyValue(double_value=0.01))]
    if request_id is not None:
        attributes.append(
            KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=request_id))
        )
    for key, value in (
        ("gen_ai.usage.prompt_tokens", prompt),
        ("gen_ai.usage.completion_tokens", completion),
    ):
        if value is not None:
            attributes.append(KeyValue(key=key, value=AnyValue(int_value=value)))
    return Span(
        trace_id=b"\x01" * 16,
        span_id=span_id,
        name=name,
        start_time_unix_nano=int((ended - took) * 1e9),
        end_time_unix_nano=int(ended * 1e9),
        attributes=attributes,
    )


def otlp_body(*spans: Span) -> bytes:
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])]
    ).SerializeToString()
