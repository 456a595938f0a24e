"""The door-state endpoint: what the door agents of a deployment whose doors
pull their state (SERVING_DOORS "<name>=pull") read, and where they report
(docs/door.md#doors-that-pull).

    GET  /doors/<deployment>/state?door=<name>&known=<generation>&wait=<seconds>
         200 {"generation", "document"} once the state is newer than `known`;
         304 after `wait` (at most MAX_WAIT_SECONDS) with nothing newer.
    POST /doors/<deployment>/ack {"door", "generation", "busy", "report", "peer_address"}
         200 {"peers": [{"name", "address"}, ...]}: the live doors that gave a
         peer_address, which a door giving one lists in its `peers` section.

Each deployment's doors share one token, derived from the secret key for that
deployment alone (`manage.py door_credential <deployment>`): it reads that
deployment's door state and reports its doors, nothing else. A request without
it, or for a deployment whose doors do not pull, gets 404: the endpoint tells
an outsider nothing. The document holds the replicas' vLLM key: doors reach
this endpoint over the cluster's network only (deploy/kustomize NetworkPolicy).
"""

from __future__ import annotations

import hmac
import json
import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.crypto import salted_hmac
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from serving.door.fleet import PULL, acknowledge, change, door_peers, heard_from
from serving.door.haproxy.config import DOOR_NAME, PEER_ADDRESS
from serving.models import Deployment, DoorState

_SALT = "serving.door.agent-token"
MAX_WAIT_SECONDS = 10.0
POLL_STEP_SECONDS = 0.05
MAX_REPORT_BYTES = 4 * 1024 * 1024


def door_token(deployment_name: str, secret: str | bytes | None = None) -> str:
    """The bearer token of a deployment's doors on this endpoint."""
    return salted_hmac(_SALT, deployment_name, secret=secret, algorithm="sha256").hexdigest()


def _deployment(request, name: str) -> Deployment | None:
    if settings.SERVING_DOORS.get(name) != PULL:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    # The fallbacks too: a rotated secret key keeps the doors routing until
    # they are given the new token.
    if not any(
        hmac.compare_digest(given.strip().encode(), door_token(name, secret).encode())
        for secret in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS)
    ):
        return None
    return Deployment.objects.filter(name=name).first()


def _not_found(name: str) -> JsonResponse:
    return JsonResponse({"detail": f"No door state for {name!r}."}, status=404)


def _bad(message: str) -> JsonResponse:
    return JsonResponse({"detail": message}, status=400)


@csrf_exempt
@require_GET
def door_state(request, name: str):
    deployment = _deployment(request, name)
    if deployment is None:
        return _not_found(name)
    door = request.GET.get("door", "")
    if not DOOR_NAME.match(door):
        return _bad("door: letters, digits, '.', '_' or '-', at most 253, required.")
    try:
        known = int(request.GET.get("known", "0"))
        wait = min(max(float(request.GET.get("wait", "0")), 0.0), MAX_WAIT_SECONDS)
    except ValueError:
        return _bad("known must be an integer and wait a number of seconds.")
    heard_from(deployment, door)
    if not DoorState.objects.filter(deployment=deployment).exclude(document={}).exists():
        change(deployment, lambda document: document)  # the first door: made from the database
    deadline = time.monotonic() + wait
    while True:
        row = DoorState.objects.filter(deployment=deployment).values("generation").first()
        generation = row["generation"] if row else 0
        if generation > known or time.monotonic() >= deadline:
            break
        time.sleep(POLL_STEP_SECONDS)
    if generation <= known:
        response = HttpResponse(status=304)
        response["ETag"] = f'"{generation}"'
        return response
    row = DoorState.objects.values("generation", "document").get(deployment=deployment)
    response = JsonResponse({"generation": row["generation"], "document": row["document"]})
    response["ETag"] = f'"{row["generation"]}"'
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
@require_POST
def door_ack(request, name: str):
    deployment = _deployment(request, name)
    if deployment is None:
        return _not_found(name)
    raw = request.read(MAX_REPORT_BYTES + 1)
    if len(raw) > MAX_REPORT_BYTES:
        return JsonResponse(
            {"detail": f"Reports are at most {MAX_REPORT_BYTES} bytes."}, status=413
        )
    try:
        body = json.loads(raw)
        door, generation, busy = body["door"], int(body["generation"]), int(body.get("busy", 0))
        report = body.get("report") or {}
        peer_address = body.get("peer_address") or ""
    except (ValueError, KeyError, TypeError, AttributeError):
        return _bad('The body is JSON: {"door", "generation", "busy", "report", "peer_address"}.')
    if not isinstance(door, str) or not DOOR_NAME.match(door):
        return _bad("door: letters, digits, '.', '_' or '-', at most 253, required.")
    if not isinstance(report, dict) or generation < 0 or busy < 0:
        return _bad("generation and busy are counts; report an object.")
    if peer_address and not (isinstance(peer_address, str) and PEER_ADDRESS.match(peer_address)):
        return _bad("peer_address: host:port, [IPv6]:port or IPv6:port.")
    acknowledge(
        deployment,
        door,
        generation=generation,
        busy=busy,
        report=report,
        peer_address=peer_address,
    )
    peers = [{"name": name, "address": address} for name, address in door_peers(deployment)]
    return JsonResponse({"peers": peers})


door_urlpatterns = [
    path("doors/<slug:name>/state", door_state, name="door-state"),
    path("doors/<slug:name>/ack", door_ack, name="door-ack"),
]
