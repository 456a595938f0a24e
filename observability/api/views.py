from __future__ import annotations

import csv
import io

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers as drf
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from core.api.views import ActorMixin
from core.errors import ValidationFailed
from observability.api.serializers import (
    PlannerInputSerializer,
    PlanSerializer,
    UsageQuerySerializer,
    UsageSerializer,
)
from observability.planning import plan_for
from observability.selectors import (
    department_costs,
    token_rows,
    unattributed_rows,
    usage_departments,
    usage_rows,
)
from serving import selectors as serving_selectors
from serving.rules.planner import HOURS_PER_MONTH, PlannerInputError


class PlannerView(ActorMixin, APIView):
    """Capacity and cost of one vLLM replica and of consolidating N use cases."""

    @extend_schema(
        request=PlannerInputSerializer,
        # The error statuses and their envelope come from core.api.schema.
        responses={200: PlanSerializer},
        summary="Plan GPU memory, the LoRA pool, the KV cache and the cost of consolidation",
    )
    def post(self, request):
        data = PlannerInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = None
        if data.validated_data.get("deployment"):
            # Outsiders get the same 404 as for a deployment that does not exist.
            deployment = serving_selectors.deployment_get(
                self.actor, data.validated_data["deployment"]
            )
        try:
            result = plan_for(data.validated_data, deployment)
        except PlannerInputError as error:
            raise drf.ValidationError(error.fields) from None
        return Response(PlanSerializer(result).data)


class UsageCSVRenderer(BaseRenderer):
    """The chargeback lines as CSV (?format=csv): one per day, deployment, calling
    key and adapter version, with vLLM's token counts."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"
    COLUMNS = (
        "day",
        "calling_department",
        "key",
        "owning_department",
        "deployment",
        "served_name",
        "version_number",
        "requests",
        "prompt_tokens",
        "completion_tokens",
    )

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(self.COLUMNS)
        for row in data["calls"]:
            writer.writerow(["" if row[name] is None else row[name] for name in self.COLUMNS])
        return out.getvalue().encode()


def usage_report(actor, params) -> dict:
    """What GET /api/v1/usage/ and the usage page show."""
    query = UsageQuerySerializer(data=params)
    query.is_valid(raise_exception=True)
    start, end = query.validated_data["start"], query.validated_data["end"]
    departments = usage_departments(actor, query.validated_data["department"])
    return {
        "start": start,
        "end": end,
        "price_per_gpu_hour": settings.PLANNER_PRICE_PER_GPU_HOUR,
        "hours_per_month": HOURS_PER_MONTH,
        "prompt_token_weight": settings.SERVING_COST_PROMPT_TOKEN_WEIGHT,
        "completion_token_weight": settings.SERVING_COST_COMPLETION_TOKEN_WEIGHT,
        "rows": list(usage_rows(departments, start, end)),
        # A platform admin asking for no one department sees calls without a key too.
        "calls": list(
            token_rows(
                departments,
                start,
                end,
                everything=actor.is_platform_admin and not query.validated_data["department"],
            )
        ),
        "costs": department_costs(departments, start, end, figures=actor.is_platform_admin),
        "unattributed": list(unattributed_rows(start, end)) if actor.is_platform_admin else [],
    }


class UsageView(ActorMixin, APIView):
    """Requests and tokens per calling department, adapter, version and day (vLLM's
    counts), requests and errors per adapter counted at the front door, and each
    department's monthly GPU cost shared by weighted tokens."""

    # The stubs type the setting as the dotted names it is written as; api_settings
    # gives the imported classes.
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, UsageCSVRenderer]  # type: ignore[list-item]
    # A department the caller does not see is not found (core.api.schema).
    error_statuses = {"get": (404,)}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "department",
                # The slug rule the query's SlugField applies, stated for clients.
                {"type": "string", "pattern": r"^[-a-zA-Z0-9_]+$"},
                description="A department's slug.",
            ),
            OpenApiParameter("from", OpenApiTypes.DATE, description="First day (UTC)."),
            OpenApiParameter("to", OpenApiTypes.DATE, description="Last day (UTC), included."),
            OpenApiParameter(
                "format", str, enum=["json", "csv"], description="csv: the `calls` rows."
            ),
        ],
        responses={
            (200, "application/json"): UsageSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            # The error statuses and their envelope come from core.api.schema.
        },
        summary="Usage and monthly cost per department",
    )
    def get(self, request):
        # As the schema says: a parameter given is not blank, and format is json or csv.
        # (The usage page's form sends blank fields for "all"; it reads them as absent.)
        params = request.query_params
        blank = [name for name in ("department", "from", "to") if params.get(name, None) == ""]
        if blank:
            raise ValidationFailed(
                f"{', '.join(blank)}: may not be blank; leave the parameter out instead.",
                details={"fields": {name: ["May not be blank."] for name in blank}},
            )
        if "format" in params and params["format"] not in ("json", "csv"):
            raise ValidationFailed(
                "format: json or csv.", details={"fields": {"format": ["json or csv."]}}
            )
        return Response(UsageSerializer(usage_report(self.actor, params)).data)

    def handle_exception(self, exc):
        # Errors keep the JSON envelope every client parses, whatever format was asked.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)
