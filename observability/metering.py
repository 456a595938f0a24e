"""Tokens as vLLM counted them, attributed by the request id the front door set.

The front door (serving/door/haproxy/) overwrites every request's
`X-Request-Id` with `u1.k<key id>.v<version id>.<uuid>`: the caller's key and
the adapter version it routes to, then a random part. vLLM 0.32 takes that
header as the base of its request id (`chatcmpl-<id>`, `cmpl-<id>-<n>` per
prompt) and, started with `--otlp-traces-endpoint`, exports one `llm_request`
span per finished request with `gen_ai.request.id` and its prompt and completion
token counts. So a caller cannot choose what it is billed as (the door
overwrites the header), and the counts are the engine's own, streams included.

This module is pure: it reads an OTLP/HTTP protobuf body into `SpanTokens`
and a request id into its attribution. Writing them is
observability.services.metered_spans_record; docs/operators/usage.md has the
design and what can be lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

SPAN_NAME = "llm_request"
REQUEST_ID = "gen_ai.request.id"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
# The door's id, version 1 of its layout; anywhere in vLLM's id (it adds a
# prefix, and a suffix per prompt of a completions request).
DOOR_ID = re.compile(
    r"(?:^|-)u1\.k(?P<key>\d{0,18})\.v(?P<version>\d{1,18})\.(?P<nonce>[0-9a-fA-F-]{32,36})"
)
MAX_REQUEST_ID = 255
# No single request holds more (vLLM's longest contexts are about 10M tokens):
# a larger count is a broken or hostile exporter, refused rather than billed.
# The receiver bounds a span further by its deployment's context (plausible).
MAX_TOKENS = 2**31 - 1
MAX_CONTEXT = 10_000_000
# Plausible times, on the receiver's clock: a span vLLM finished is sent within
# a second and retried for a minute (scripts/vllm/serve.sh), then dropped by the
# exporter; so one from the future beyond clock skew, or from more than an hour
# ago, is not vLLM's (and would rewrite a day, or a month, already reported).
MAX_SKEW_SECONDS = 300
MAX_AGE_SECONDS = 3600


class SpansRefused(ValueError):
    """The body is not an OTLP traces export this endpoint reads."""


@dataclass(frozen=True)
class Attribution:
    key_id: int | None  # None: no key (an open door)
    version_id: int | None  # None: the base model


@dataclass(frozen=True)
class SpanTokens:
    request_id: str
    finished_at: datetime
    prompt_tokens: int
    completion_tokens: int
    # The span's own id (hex): each of a request's `n` choices is an engine
    # request of its own with the SAME request id and a span of its own, so the
    # ledger tells them apart by it (a resent batch repeats it: counted once).
    span_id: str = ""
    # When vLLM took the request (the span's start): what the reconcile of
    # vLLM's token counters against spans settles by (observability.reconcile).
    started_at: datetime | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def attribution(self) -> Attribution | None:
        return attribution(self.request_id)


def attribution(request_id: str) -> Attribution | None:
    """Who called and what served, from an id the door set; None for an id it
    did not set (a request sent to a replica directly)."""
    match = DOOR_ID.search(request_id)
    if match is None:
        return None
    key, version = match["key"], int(match["version"])
    return Attribution(key_id=int(key) if key else None, version_id=version or None)


def _attributes(span) -> dict:
    values = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        if kind in ("string_value", "int_value", "double_value"):
            values[item.key] = getattr(item.value, kind)
    return values


def _count(value) -> int | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def read_spans(body: bytes) -> tuple[list[SpanTokens], int]:
    """The `llm_request` spans of an ExportTraceServiceRequest, and how many of
    them were refused (no id, or counts that are not counts). Other spans are
    no concern of metering and are skipped. Raises SpansRefused for a body that
    is not one."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError) as error:
        raise SpansRefused(f"not an OTLP ExportTraceServiceRequest (protobuf): {error}") from None
    found, refused = [], 0
    now = datetime.now(tz=UTC)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                if span.name != SPAN_NAME:
                    continue
                values = _attributes(span)
                request_id = values.get(REQUEST_ID)
                prompt = _count(values.get(PROMPT_TOKENS))
                completion = _count(values.get(COMPLETION_TOKENS))
                if (
                    not isinstance(request_id, str)
                    or not 0 < len(request_id) <= MAX_REQUEST_ID
                    or prompt is None
                    or completion is None
                ):
                    refused += 1
                    continue
                ended = span.end_time_unix_nano or span.start_time_unix_nano
                started = span.start_time_unix_nano
                found.append(
                    SpanTokens(
                        request_id=request_id,
                        finished_at=(datetime.fromtimestamp(ended / 1e9, tz=UTC) if ended else now),
                        prompt_tokens=prompt,
                        completion_tokens=completion,
                        span_id=span.span_id.hex()[:16],
                        started_at=(
                            datetime.fromtimestamp(started / 1e9, tz=UTC) if started else None
                        ),
                    )
                )
    return found, refused


def implausible(span: SpanTokens, *, now: datetime, max_context: int | None) -> str | None:
    """Why a span cannot be one of vLLM's for a deployment whose context is
    `max_context` tokens (None: unknown), at `now`; None when it can."""
    limit = max_context or MAX_CONTEXT
    if span.tokens > limit:
        return f"{span.tokens} tokens in one request, more than its context of {limit}"
    age = (now - span.finished_at).total_seconds()
    if age < -MAX_SKEW_SECONDS:
        return f"finished {-age:.0f} s in the future"
    if age > MAX_AGE_SECONDS:
        return f"finished {age:.0f} s ago"
    if span.started_at is not None and span.started_at > span.finished_at:
        return "started after it finished"
    return None
