"""The probes: /livez (the process answers) and /readyz (its dependencies do).

/livez touches nothing: a liveness probe that checks the database restarts
every web pod when the database blips, which helps nobody. /readyz asks the
database, the broker and every app's `health_check` receiver (the artifact
store, MLflow) and answers with their names and ok/not ok only: it is
anonymous, and the errors name endpoints and buckets, so they go to the log.
A receiver's "notice" is shown: a sentence written to be public (serving says
which front doors are open).
"""

from __future__ import annotations

import logging

from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from core.signals import health_check

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_SECONDS = 3


def _database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as error:  # any driver error means "not ready"
        logger.warning("readiness: database: %s", error)
        return {"ok": False}
    return {"ok": True}


def _broker() -> dict:
    # The project's app (config/__init__.py makes it current): no app imports config.
    from celery import current_app as app

    try:
        with app.connection_for_write(connect_timeout=BROKER_TIMEOUT_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
    except Exception as error:  # kombu raises the transport's own errors
        logger.warning("readiness: broker: %s", error)
        return {"ok": False}
    return {"ok": True}


def _names_only(name: str, result: dict) -> dict:
    if not result.get("ok", True):
        logger.warning("readiness: %s: %s", name, result)
    shown: dict[str, object] = {"ok": bool(result.get("ok", True))}
    if result.get("optional"):
        shown["optional"] = True
    if result.get("notice"):
        # A sentence its receiver wrote to be public (an open front door).
        shown["notice"] = str(result["notice"])
    return shown


_Check = inline_serializer(
    "ReadinessCheck",
    {
        "ok": serializers.BooleanField(),
        "optional": serializers.BooleanField(required=False),
        "notice": serializers.CharField(required=False),
    },
)
_Readiness = inline_serializer(
    "Readiness",
    {
        "status": serializers.ChoiceField(choices=["ok", "unavailable"]),
        "checks": serializers.DictField(child=_Check),
    },
)


class LivenessView(APIView):
    """200 while the process answers requests; no dependency is asked."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses=inline_serializer("Liveness", {"status": serializers.CharField()}))
    def get(self, request):
        return Response({"status": "ok"})


class ReadinessView(APIView):
    """200 when the database, the broker and the artifact store answer (MLflow
    is optional), else 503; names and ok only."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: _Readiness, 503: _Readiness})
    def get(self, request):
        checks = {"database": _database(), "broker": _broker()}
        for _receiver, (name, result) in health_check.send(sender=self.__class__):
            checks[name] = _names_only(name, result)
        ready = all(c["ok"] or c.get("optional") for c in checks.values())
        return Response(
            {"status": "ok" if ready else "unavailable", "checks": checks},
            status=status.HTTP_200_OK if ready else status.HTTP_503_SERVICE_UNAVAILABLE,
        )
