"""GET /metrics for Prometheus: a bearer token, or open where configured."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from observability.collector import control_plane_registry


def _authorised(request) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # Constant time: a timing difference must not reveal how much of a guess was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@require_GET
def metrics(request):
    if not settings.METRICS_ALLOW_ANONYMOUS:
        if not settings.METRICS_TOKEN:
            # Neither a token nor open access is configured: metrics are off.
            raise Http404("Metrics are not enabled.")
        if not _authorised(request):
            response = HttpResponse("A valid metrics bearer token is required.\n", status=401)
            response["Content-Type"] = "text/plain; charset=utf-8"
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    response = HttpResponse(
        generate_latest(control_plane_registry()), content_type=CONTENT_TYPE_LATEST
    )
    response["Cache-Control"] = "no-store"
    return response
