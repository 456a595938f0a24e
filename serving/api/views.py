from __future__ import annotations

from typing import Any

from django_filters import rest_framework as filters
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.access import require_platform_admin
from core.api.filters import IntegerFilter, StrictFilterSet
from core.api.views import ActorMixin, schema_only
from core.errors import NotFound, ReferenceNotFound
from core.models import Department
from registry import selectors as registry_selectors
from registry.api.serializers import RejectSerializer
from serving import kserve, selectors
from serving.api import serializers as s
from serving.capacity import tiers_by_deployment
from serving.gate import evaluate_gate
from serving.models import CanaryRequest, Deployment, Promotion, Rollout
from serving.records.placements import served_placement_set
from serving.services.adoptions import adoption_create, strays_of
from serving.services.deployments import deployment_create, deployment_delete, deployment_update
from serving.services.manifests import kserve_export
from serving.services.promotions import promotion_create, promotion_review, retire, rollback_to
from serving.services.rollout_requests import rollout_canary_decide, rollout_cancel

# Platform admins read the whole deployment, members and tokens its summary:
# the schema says "one of the two", and each has fields the other lacks.
DEPLOYMENT_AS_SEEN: dict[str, Any] = {
    "component_name": "DeploymentAsSeen",
    "serializers": [s.DeploymentSerializer, s.DeploymentSummarySerializer],
    "resource_type_field_name": None,
}


def _departments(slugs: list[str] | None) -> list[Department] | None:
    if slugs is None:
        return None
    found = {d.slug: d for d in Department.objects.filter(slug__in=slugs)}
    missing = sorted(set(slugs) - set(found))
    if missing:
        raise ReferenceNotFound(
            f"No department {', '.join(missing)}.",
            code="department_not_found",
            details={"allowed_departments": missing},
        )
    return [found[slug] for slug in dict.fromkeys(slugs)]


@extend_schema_view(
    list=extend_schema(responses=PolymorphicProxySerializer(**DEPLOYMENT_AS_SEEN, many=True)),
    retrieve=extend_schema(responses=PolymorphicProxySerializer(**DEPLOYMENT_AS_SEEN)),
)
class DeploymentViewSet(ActorMixin, viewsets.ModelViewSet):
    """Platform admins create, change and see everything about deployments;
    members and tokens read the deployments their departments may use, in summary."""

    serializer_class = s.DeploymentSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = Deployment.objects.none()
    lookup_field = "name"
    ordering_fields = ["name", "environment"]
    filterset_fields = ["environment"]
    # KServe manifests need the deployment's volume claims set (kserve_incomplete);
    # a rollback runs the compatibility gate again (compatibility_gate_failed).
    error_statuses = {"kserve": (409,), "rollback": (422,)}

    def get_queryset(self):
        if schema_only(self):
            return Deployment.objects.none()
        return selectors.deployments_for(self.actor)

    def get_object(self):
        return selectors.deployment_get(self.actor, self.kwargs["name"])

    def get_serializer_class(self):
        # The schema documents the admin's shape (a superset of the summary).
        if getattr(self, "swagger_fake_view", False) or selectors.sees_infrastructure(self.actor):
            return s.DeploymentSerializer
        return s.DeploymentSummarySerializer

    def list(self, request):
        # The tiers of a whole page in a fixed number of queries, not a few per row.
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        rows = list(queryset if page is None else page)
        context = {**self.get_serializer_context(), "tiers": tiers_by_deployment(rows)}
        data = self.get_serializer_class()(rows, many=True, context=context).data
        return Response(data) if page is None else self.get_paginated_response(data)

    def create(self, request):
        # Who may write comes before what they wrote: a member's body is not
        # judged (nor its department names looked up), it is refused.
        require_platform_admin(self.actor)
        deployment = deployment_create(actor=self.actor, **self._values(request))
        return Response(s.DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)

    def update(self, request, name=None, partial=False):
        deployment = self.get_object()
        require_platform_admin(self.actor)
        deployment = deployment_update(
            actor=self.actor, deployment=deployment, **self._values(request, deployment, partial)
        )
        return Response(s.DeploymentSerializer(deployment).data)

    def _values(self, request, deployment=None, partial=False) -> dict:
        data = s.DeploymentSerializer(deployment, data=request.data, partial=partial)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        if "allowed_departments" in values:
            values["allowed_departments"] = _departments(values["allowed_departments"])
        return values

    def partial_update(self, request, name=None):
        return self.update(request, name, partial=True)

    def destroy(self, request, name=None):
        deployment_delete(actor=self.actor, deployment=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def state(self, request, name=None):
        """Desired versus actual, per replica."""
        return Response(selectors.deployment_state(self.actor, self.get_object()))

    @extend_schema(methods=["GET"], responses=s.PlacementSerializer(many=True))
    @extend_schema(
        methods=["PUT"], request=s.PlacementBoundsSerializer, responses=s.PlacementSerializer
    )
    # A bare list: one row per adapter the actor may see.
    @action(detail=True, methods=["get", "put"], pagination_class=None)
    def placement(self, request, name=None):
        """Where each adapter lives and why (GET); how many replicas hold one
        adapter (PUT: min_replicas and max_replicas, null for every replica).
        The next reconcile or rollout moves it."""
        deployment = self.get_object()
        if request.method == "GET":
            return Response(selectors.deployment_placement(self.actor, deployment))
        data = s.PlacementBoundsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        adapter = registry_selectors.adapter_get(self.actor, values["adapter"])
        served = served_placement_set(
            actor=self.actor,
            deployment=deployment,
            adapter=adapter,
            min_replicas=values["min_replicas"],
            max_replicas=values["max_replicas"],
        )
        rows = selectors.deployment_placement(self.actor, deployment)
        mine = next((r for r in rows if r["served_name"] == adapter.served_name), None)
        if mine is None:  # not served yet: its bounds wait for its first promotion
            mine = selectors.placement_pending(served)
        return Response(mine)

    @extend_schema(responses={(200, "application/yaml"): str})
    @action(detail=True, methods=["get"])
    def kserve(self, request, name=None):
        """The ServingRuntime and InferenceService that run this deployment on
        KServe with every promoted adapter in --lora-modules (YAML)."""
        deployment = self.get_object()
        text = kserve_export(actor=self.actor, deployment=deployment)
        return kserve.yaml_download(text, deployment)

    @extend_schema(parameters=[OpenApiParameter("version", int, required=True)], responses=dict)
    @action(detail=True, methods=["get"])
    def gate(self, request, name=None):
        """The compatibility gate's checks for a version, without promoting it."""
        deployment = self.get_object()
        try:
            version_id = int(request.query_params.get("version", ""))
        except ValueError:
            from core.errors import ValidationFailed

            raise ValidationFailed("Give ?version=<id>.") from None
        version = registry_selectors.version_get(self.actor, version_id)
        report = evaluate_gate(deployment, version)
        return Response({"passed": report.passed, "checks": report.as_list()})

    @extend_schema(request=s.RollbackSerializer, responses={202: s.RolloutSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, name=None):
        deployment = self.get_object()
        data = s.RollbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = registry_selectors.adapter_get(self.actor, data.validated_data["adapter"])
        version = None
        if "version" in data.validated_data:
            version = registry_selectors.version_get(self.actor, data.validated_data["version"])
        rollout = rollback_to(
            actor=self.actor, deployment=deployment, adapter=adapter, version=version
        )
        return Response(_rollout_body(self.actor, rollout.pk), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.RetireSerializer, responses={202: s.RolloutSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request, name=None):
        deployment = self.get_object()
        data = s.RetireSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = registry_selectors.adapter_get(self.actor, data.validated_data["adapter"])
        rollout = retire(actor=self.actor, deployment=deployment, adapter=adapter)
        return Response(_rollout_body(self.actor, rollout.pk), status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.StraySerializer(many=True))
    # A bare list, as the schema now says (it is never long: one replica's extras).
    @action(detail=True, methods=["get"], pagination_class=None)
    def strays(self, request, name=None):
        """Adapters the replicas serve that the registry does not manage (platform
        admins): what can be adopted."""
        require_platform_admin(self.actor)
        strays = strays_of(self.get_object())
        return Response([{"served_name": name, **entry} for name, entry in strays.items()])

    @extend_schema(request=s.AdoptRequestSerializer, responses={201: s.AdoptionSerializer})
    @action(detail=True, methods=["post"])
    def adopt(self, request, name=None):
        """Registers a stray through the normal ingest and submits it; once an approver
        (not you) approves the version, it is promoted like any version (the
        deployment's departments and promotion approval apply) and served from the
        registry's copy of the reviewed files, never from the stray's folder."""
        require_platform_admin(self.actor)
        deployment = self.get_object()
        data = s.AdoptRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        department = Department.objects.filter(slug=data.validated_data["department"]).first()
        if department is None:
            raise NotFound("No such department.", code="department_not_found")
        adoption = adoption_create(
            actor=self.actor,
            deployment=deployment,
            served_name=data.validated_data["served_name"],
            department=department,
            name=data.validated_data["adapter"],
        )
        return Response(s.AdoptionSerializer(adoption).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=s.DriftEventSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="drift-events")
    def drift_events(self, request, name=None):
        rows = selectors.drift_events_for(self.actor, self.get_object())
        page = self.paginate_queryset(rows)
        if selectors.sees_infrastructure(self.actor):
            serializer = s.DriftEventSerializer
        else:
            serializer = s.DriftEventSummarySerializer
        return self.get_paginated_response(serializer(page, many=True).data)


def _rollout_body(actor, rollout_id: int) -> dict:
    return s.RolloutSerializer(selectors.rollout_for_display(actor, rollout_id)).data


class PromotionViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = s.PromotionSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = Promotion.objects.none()
    filterset_fields = ["status"]
    ordering_fields = ["created_at"]
    # Promoting, and approving a promotion, run the compatibility gate.
    error_statuses = {"create": (422,), "approve": (422,)}

    def get_queryset(self):
        if schema_only(self):
            return Promotion.objects.none()
        return selectors.promotions_for(self.actor).prefetch_related("rollouts")

    def get_object(self):
        return selectors.promotion_get(self.actor, self.lookup_id())

    @extend_schema(request=s.PromotionCreateSerializer, responses={201: s.PromotionSerializer})
    def create(self, request):
        data = s.PromotionCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = selectors.deployment_get(self.actor, data.validated_data["deployment"])
        version = registry_selectors.version_get(self.actor, data.validated_data["version"])
        promotion = promotion_create(
            actor=self.actor,
            deployment=deployment,
            version=version,
            canary=data.validated_data["canary"],
            canary_share=(data.validated_data["traffic_canary"] or {}).get("share"),
            canary_bake_seconds=(data.validated_data["traffic_canary"] or {}).get("bake_seconds"),
        )
        return Response(s.PromotionSerializer(promotion).data, status=status.HTTP_201_CREATED)

    def _review(self, request, approve: bool) -> Response:
        data = (s.ReviewSerializer if approve else RejectSerializer)(data=request.data)
        data.is_valid(raise_exception=True)
        promotion = promotion_review(
            actor=self.actor,
            promotion=self.get_object(),
            approve=approve,
            comment=data.validated_data["comment"],
        )
        return Response(s.PromotionSerializer(promotion).data)

    @extend_schema(request=s.ReviewSerializer, responses=s.PromotionSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Four-eyes: an approver of the department or a platform admin, not the requester."""
        return self._review(request, approve=True)

    @extend_schema(request=RejectSerializer, responses=s.PromotionSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        """A comment is required."""
        return self._review(request, approve=False)


class RolloutFilter(StrictFilterSet):
    deployment = filters.CharFilter(field_name="deployment__name")
    # By id, not a model choice: an unknown id matches nothing (an empty page), as
    # every other id filter does, instead of a 400 the schema cannot predict.
    adapter = IntegerFilter(field_name="adapter_id")
    served_name = filters.CharFilter(field_name="adapter__served_name")

    class Meta:
        model = Rollout
        fields = ["deployment", "adapter", "status", "kind", "served_name"]


class RolloutViewSet(ActorMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.RolloutSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = Rollout.objects.none()
    filterset_class = RolloutFilter
    ordering_fields = ["created_at", "finished_at"]
    # Rolling back runs the compatibility gate again.
    error_statuses = {"rollback": (422,)}

    def get_queryset(self):
        if schema_only(self):
            return Rollout.objects.none()
        return selectors.rollouts_for(self.actor)

    def get_object(self):
        return selectors.rollout_get(self.actor, self.lookup_id())

    def retrieve(self, request, pk=None):
        return Response(_rollout_body(self.actor, self.lookup_id()))

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return None if page is None else selectors.rollouts_for_display(self.actor, page)

    @extend_schema(request=s.CancelSerializer, responses=s.RolloutSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop an unfinished rollout for good (approvers of the department and
        platform admins). The adapter is free for a new promotion at once; the
        reconcile puts back what was served before on replicas already changed."""
        data = s.CancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rollout = rollout_cancel(
            actor=self.actor, rollout=self.get_object(), comment=data.validated_data["comment"]
        )
        return Response(_rollout_body(self.actor, rollout.pk))

    def _canary(self, request, decision: str) -> Response:
        data = s.CancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rollout = rollout_canary_decide(
            actor=self.actor,
            rollout=self.get_object(),
            request=decision,
            comment=data.validated_data["comment"],
        )
        return Response(_rollout_body(self.actor, rollout.pk), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.CancelSerializer, responses={202: s.RolloutSerializer})
    @action(detail=True, methods=["post"], url_path="promote-now")
    def promote_now(self, request, pk=None):
        """A baking canary takes all the traffic now, whatever its gates say so far
        (approvers of the department and platform admins). The worker swaps the
        other replicas within a second; 409 canary_not_baking otherwise."""
        return self._canary(request, CanaryRequest.PROMOTE)

    @extend_schema(request=s.CancelSerializer, responses={202: s.RolloutSerializer})
    @action(detail=True, methods=["post"], url_path="abort-canary")
    def abort_canary(self, request, pk=None):
        """A baking canary is rolled back now: the front door sends it nothing new
        (a traffic switch) and its replica goes back to the old version
        (approvers of the department and platform admins)."""
        return self._canary(request, CanaryRequest.ABORT)

    @extend_schema(request=None, responses={202: s.RolloutSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """Put this rollout's adapter back on the version served before it."""
        rollout = self.get_object()
        if rollout.previous_version is None:
            from core.errors import Conflict

            raise Conflict(
                "Nothing was served before this rollout.", code="nothing_to_roll_back_to"
            )
        new = rollback_to(
            actor=self.actor,
            deployment=rollout.deployment,
            adapter=rollout.adapter,
            version=rollout.previous_version,
        )
        return Response(_rollout_body(self.actor, new.pk), status=status.HTTP_202_ACCEPTED)
