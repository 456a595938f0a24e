"""REST endpoints of the MLflow integration, under /api/v1/ (config/urls.py):

POST /api/v1/adapters/{id}/versions/from-mlflow-run/   register from a run
GET  /api/v1/adapters/{id}/mlflow-aliases/             alias mirror state
GET  /api/v1/versions/{id}/mlflow-mirror/              version mirror state
POST /api/v1/mlflow/webhooks/                          MLflow's signed webhook deliveries
"""

from __future__ import annotations

from django.conf import settings
from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter
from rest_framework.views import APIView

from core.access import require_platform_admin
from core.actors import client_address_of
from core.api.views import ActorMixin, schema_only
from core.errors import ApplicationError, NotFound, ReferenceNotFound
from core.models import Department
from core.redaction import redact
from mlflow_bridge import experiments, lineage, mirror, webhooks
from mlflow_bridge.models import AllowedExperiment
from registry import selectors
from registry.api.serializers import DepartmentSlugField, VersionSerializer

# lineage._clean_artifact_path's rule, for the schema: a relative path of
# segments that are not empty, "." or "..", without backslashes.
_PART = r"(?:[^/\\.\s\x00][^/\\\x00]*|\.[^/\\.\x00][^/\\\x00]*|\.\.[^/\\\x00]+)"


@extend_schema_field({"type": "string", "maxLength": 500, "pattern": rf"^{_PART}(?:/{_PART})*$"})
class ArtifactPathField(serializers.CharField):
    pass


class FromRunSerializer(serializers.Serializer):
    run_id = serializers.RegexField(lineage.RUN_ID_PATTERN, max_length=64)
    artifact_path = ArtifactPathField(
        max_length=500, help_text="Where the run logged the adapter, e.g. 'adapter'."
    )


class VersionFromRunView(ActorMixin, APIView):
    parser_classes = [JSONParser, FormParser, MultiPartParser]
    # MLflow unreachable or not configured; the artifact refused for its size or type.
    error_statuses = {"*": (413, 415, 503)}

    @extend_schema(
        request=FromRunSerializer,
        responses={201: VersionSerializer, 200: VersionSerializer},
        description=(
            "Registers the adapter a FINISHED MLflow run logged at `artifact_path`. "
            "The same run again returns the existing version (200). 404: unknown run, or "
            "no MLflow on this registry (mlflow_not_configured); "
            "400: no such artifact path (the message lists the run's artifacts); "
            "503: MLflow unreachable, nothing registered."
        ),
    )
    def post(self, request, pk: int):
        adapter = selectors.adapter_get(self.actor, int(pk))
        data = FromRunSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = lineage.register_from_run(
            actor=self.actor,
            adapter=adapter,
            run_id=data.validated_data["run_id"],
            artifact_path=data.validated_data["artifact_path"],
        )
        body = VersionSerializer(result.version).data
        body["warnings"] = result.warnings
        return Response(
            body,
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
            headers={} if result.created else {"Idempotent-Replayed": "true"},
        )


def _shown(actor, summary: dict) -> dict:
    # MLflow's error texts name the tracking server; members get them redacted.
    if "last_error" in summary and not actor.is_platform_admin:
        summary = {**summary, "last_error": redact(summary["last_error"])}
    return summary


_AliasSerializer = inline_serializer(
    "MlflowAliasMirror",
    {
        "deployment_name": serializers.CharField(),
        "alias": serializers.CharField(),
        "version": serializers.IntegerField(allow_null=True),
        "state": serializers.CharField(),
        "attempts": serializers.IntegerField(),
        "last_error": serializers.CharField(),
        "updated_at": serializers.DateTimeField(),
        "synced_at": serializers.DateTimeField(allow_null=True),
    },
    many=True,
)


class AdapterAliasesView(ActorMixin, APIView):
    @extend_schema(responses=_AliasSerializer)
    def get(self, request, pk: int):
        adapter = selectors.adapter_get(self.actor, int(pk))
        rows = adapter.mlflow_aliases.select_related("deployment").order_by("alias")
        return Response([_shown(self.actor, mirror.alias_mirror_summary(row)) for row in rows])


_VersionMirrorSerializer = inline_serializer(
    "MlflowVersionMirror",
    {
        "enabled": serializers.BooleanField(),
        "state": serializers.CharField(allow_null=True, required=False),
        "registered_model": serializers.CharField(required=False),
        "model_version": serializers.CharField(allow_null=True, required=False),
        "status_in_mlflow": serializers.CharField(allow_null=True, required=False),
        "url": serializers.CharField(allow_null=True, required=False),
        "attempts": serializers.IntegerField(required=False),
        "last_error": serializers.CharField(required=False),
        "updated_at": serializers.DateTimeField(required=False),
        "synced_at": serializers.DateTimeField(allow_null=True, required=False),
    },
)


class VersionMirrorView(ActorMixin, APIView):
    @extend_schema(
        responses=_VersionMirrorSerializer,
        description="Whether the version is mirrored to MLflow's Model Registry yet.",
    )
    def get(self, request, pk: int):
        version = selectors.version_get(self.actor, int(pk))
        return Response(_shown(self.actor, mirror.version_mirror_summary(version)))


class PayloadTooLarge(ApplicationError):
    status = 413
    code = "too_large"


class WebhookView(APIView):
    """MLflow signs the delivery; there is no user or token to authenticate."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    error_statuses = {"*": (401, 404, 413, 429)}

    @extend_schema(
        request=None,
        responses={
            202: inline_serializer(
                "WebhookAccepted",
                {"delivery": serializers.IntegerField(), "status": serializers.CharField()},
            )
        },
        description=(
            "Where MLflow 3 delivers webhooks (create one with `MlflowClient.create_webhook`, "
            "events `model_version.created` and `model_version_alias.created`, and the "
            "registry's MLFLOW_WEBHOOK_SECRET as its secret). 202: verified and recorded; "
            "the version is registered by a worker, for the departments and events a "
            "platform admin set rules for. 401: bad signature, stale timestamp or a replay "
            "(counted per source and window, audited as counts). 429: too many refusals "
            "from this address in this window. 404: webhooks are off (no "
            "MLFLOW_WEBHOOK_SECRET)."
        ),
    )
    def post(self, request):
        if not webhooks.enabled():
            raise NotFound("MLflow webhooks are not enabled on this registry.")
        client_address = client_address_of(request)
        webhooks.webhook_throttle(client_address=client_address)
        length = request.META.get("CONTENT_LENGTH") or "0"
        limit = settings.MLFLOW_WEBHOOK_MAX_BYTES
        if not length.isdigit() or int(length) > limit:
            raise PayloadTooLarge(f"A webhook body is at most {limit} bytes.")
        # The raw bytes: the signature is over them, not over a parsed copy.
        delivery = webhooks.webhook_receive(
            headers=request.headers,
            body=request.body,
            client_address=client_address,
        )
        return Response(
            {"delivery": delivery.pk, "status": delivery.status}, status=status.HTTP_202_ACCEPTED
        )


class AllowedExperimentSerializer(serializers.ModelSerializer):
    # A slug the view resolves: one that names no department is a 404, as elsewhere.
    department = DepartmentSlugField()
    experiment = serializers.CharField(
        write_only=True, help_text="The MLflow experiment's id or name."
    )
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = AllowedExperiment
        fields = [
            "id",
            "department",
            "experiment",
            "experiment_id",
            "experiment_name",
            "created_by",
            "created_at",
        ]
        read_only_fields = ["experiment_id", "experiment_name", "created_at"]


class AllowedExperimentViewSet(
    ActorMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Which MLflow experiments each department may register runs from:
    platform admins only, every change audited (like artifact sources)."""

    serializer_class = AllowedExperimentSerializer
    queryset = AllowedExperiment.objects.none()
    ordering_fields = ["experiment_id", "created_at"]

    def get_queryset(self):
        if schema_only(self):
            return AllowedExperiment.objects.none()
        require_platform_admin(self.actor)
        return AllowedExperiment.objects.select_related("department", "created_by")

    def get_object(self):
        grant = self.get_queryset().filter(pk=self.lookup_id()).first()
        if grant is None:
            raise NotFound("Allowed experiment not found.")
        return grant

    def create(self, request):
        require_platform_admin(self.actor)
        data = AllowedExperimentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        department = Department.objects.filter(slug=data.validated_data["department"]).first()
        if department is None:
            raise ReferenceNotFound("No such department.", code="department_not_found")
        grant = experiments.allowed_experiment_create(
            actor=self.actor,
            department=department,
            experiment=data.validated_data["experiment"],
        )
        return Response(AllowedExperimentSerializer(grant).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        experiments.allowed_experiment_delete(actor=self.actor, grant=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


_router = DefaultRouter()
_router.register("mlflow-experiments", AllowedExperimentViewSet, basename="mlflow-experiment")

urlpatterns = [
    *_router.urls,
    path("mlflow/webhooks/", WebhookView.as_view(), name="mlflow-webhooks"),
    path(
        "versions/<int:pk>/mlflow-mirror/",
        VersionMirrorView.as_view(),
        name="version-mlflow-mirror",
    ),
    path(
        "adapters/<int:pk>/versions/from-mlflow-run/",
        VersionFromRunView.as_view(),
        name="adapter-version-from-mlflow-run",
    ),
    path(
        "adapters/<int:pk>/mlflow-aliases/",
        AdapterAliasesView.as_view(),
        name="adapter-mlflow-aliases",
    ),
]
