"""POST /otlp/<deployment>/v1/traces: the OTLP/HTTP receiver of vLLM's
`llm_request` spans (observability.metering), protobuf only.

Who may post: a replica of that deployment. Each deployment has its own token
(an HMAC of its name under the Django secret key: nothing to store, shown by
`manage.py metering_token <deployment>`), which its replicas send as
`Authorization: Bearer` (OTEL_EXPORTER_OTLP_TRACES_HEADERS, scripts/vllm/serve.sh).
A token counts only for its own deployment's URL, so a replica of one
deployment cannot bill another's. Keep the path internal all the same (a
network policy: replicas to the control plane); the token is what is enforced.

What a token may report: spans of keys whose department may call that
deployment, with counts within its context and times vLLM could have sent
(observability.tokens.spans_admitted); the rest are refused in partial_success.

Bounds: a declared or read body past OBSERVABILITY_OTLP_MAX_BODY_BYTES is a 413
(gzip too: decompressed, it is cut at the same limit). Answers follow OTLP/HTTP:
200 with an ExportTraceServiceResponse (partial_success names refused spans),
400 for a body that is not one (not retried by the exporter), 503 when the
database does not answer (retried: the ledger makes a resend count once).
"""

from __future__ import annotations

import hmac
import logging
import zlib

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpResponse
from django.utils.crypto import salted_hmac
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from observability.metering import SpansRefused, read_spans
from observability.tokens import metered_spans_record, spans_admitted
from serving.models import Deployment

logger = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
_SALT = "observability.otlp.metering-token"


def metering_token(deployment_name: str, secret: str | bytes | None = None) -> str:
    """The bearer token of a deployment's replicas on the OTLP receiver."""
    return salted_hmac(_SALT, deployment_name, secret=secret, algorithm="sha256").hexdigest()


def _authorised(request, name: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    # The fallbacks too: a rotated secret key keeps replicas metered until they
    # are given the new token.
    for secret in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS):
        if hmac.compare_digest(given.strip().encode(), metering_token(name, secret).encode()):
            return True
    return False


def _text(message: str, status: int) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def _body(request, limit: int) -> bytes | None:
    """The body, decompressed; None past `limit` (read or decompressed)."""
    raw = request.read(limit + 1)
    if len(raw) > limit:
        return None
    if request.headers.get("Content-Encoding", "").lower() != "gzip":
        return raw
    inflater = zlib.decompressobj(wbits=31)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as error:
        raise SpansRefused(f"not gzip: {error}") from None
    return None if len(body) > limit else body


@csrf_exempt
@require_POST
def otlp_traces(request, name: str):
    limit = settings.OBSERVABILITY_OTLP_MAX_BODY_BYTES
    if not _authorised(request, name):
        response = _text("A valid metering token of this deployment is required.", 401)
        response["WWW-Authenticate"] = 'Bearer realm="otlp"'
        return response
    deployment = Deployment.objects.filter(name=name).first()
    if deployment is None:
        return _text(f"No deployment {name!r}.", 404)
    content_type = request.content_type or ""
    if content_type != PROTOBUF:
        return _text(f"Content-Type must be {PROTOBUF} (OTLP/HTTP protobuf).", 415)
    if request.headers.get("Content-Encoding", "identity").lower() not in ("identity", "gzip"):
        return _text("Content-Encoding must be gzip or none.", 415)
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return _text("Content-Length is not a number.", 400)
    too_large = _text(f"The body is larger than {limit} bytes.", 413)
    if declared > limit:
        return too_large
    try:
        body = _body(request, limit)
        if body is None:
            return too_large
        spans, refused = read_spans(body)
    except SpansRefused as error:
        return _text(str(error), 400)
    try:
        spans, turned_away = spans_admitted(deployment, spans)
        metered_spans_record(deployment, spans)
    except DatabaseError as error:
        logger.warning("metering of %s: spans not recorded: %s", name, error)
        return _text("Not recorded; send again.", 503)
    reasons = [f"{refused} without gen_ai.request.id or token counts"] if refused else []
    reasons += [f"{n} {why}" for why, n in sorted(turned_away.items())]
    if turned_away:
        # A replica's token used for other keys, or a broken exporter: worth a look.
        logger.warning("metering of %s: spans refused: %s", name, "; ".join(reasons))
    answer = ExportTraceServiceResponse()
    if reasons:
        answer.partial_success.rejected_spans = refused + sum(turned_away.values())
        answer.partial_success.error_message = "llm_request spans refused: " + "; ".join(reasons)
    return HttpResponse(answer.SerializeToString(), content_type=PROTOBUF)
