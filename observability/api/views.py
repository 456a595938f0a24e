from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers as drf
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.views import ActorMixin
from observability.api.serializers import PlannerInputSerializer, PlanSerializer
from observability.planning import plan_for
from serving import selectors as serving_selectors
from serving.planner import PlannerInputError


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
