"""HTTP endpoints for pipelines and tools. Each view parses input, calls one
service or selector with the Actor, and serializes the result."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions as drf_exceptions
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from core import selectors as core_selectors
from core.access import require_contributor, require_platform_admin
from core.api.filters import IntegerFilter, StrictFilterSet
from core.api.views import ActorMixin, schema_only
from core.body_limit import accepts_large_body
from core.errors import NotFound
from core.models import Ability, Department
from registry import selectors
from registry.api import serializers as s
from registry.api.filters import AdapterFilter, VersionFilter
from registry.artifact_store import get_artifact_store
from registry.ingest.incoming import S3Prefix, UploadedFiles
from registry.ingest.streamed import install_streaming_handler
from registry.models import Adapter, AdapterVersion, ArtifactSource, VersionStatus
from registry.request_digest import install_digest_handler, request_digest
from registry.services.adapters import adapter_create, adapter_update
from registry.services.artifact_sources import (
    artifact_source_create,
    artifact_source_delete,
    artifact_source_update,
)
from registry.services.idempotency import (
    idempotency_bind,
    idempotency_claim,
    idempotency_complete,
    idempotency_release,
    idempotency_result,
)
from registry.services.versions import (
    Lineage,
    ingest_limits,
    version_prefix,
    version_register,
    version_transition,
)


class AdapterViewSet(
    ActorMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = s.AdapterSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = Adapter.objects.none()
    filterset_class = AdapterFilter
    ordering_fields = ["name", "created_at", "updated_at"]
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    # Registration can refuse the artifact's size or type, and needs the store.
    error_statuses = {"versions": (413, 415, 503)}

    def get_parsers(self):
        # Multipart is for artifacts. A PATCH sent as multipart that Django cannot
        # parse arrived as "no fields" and answered 200; JSON only, as documented.
        if getattr(self, "action", None) == "partial_update":
            return [JSONParser()]
        return super().get_parsers()

    def get_queryset(self):
        if schema_only(self):
            return Adapter.objects.none()
        return selectors.adapters_for(self.actor)

    def get_object(self):
        return selectors.adapter_get(self.actor, self.lookup_id())

    @extend_schema(request=s.AdapterCreateSerializer, responses={201: s.AdapterSerializer})
    def create(self, request):
        data = s.AdapterCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = core_selectors.department_get(self.actor, values.pop("department"))
        adapter = adapter_create(actor=self.actor, department=department, **values)
        return Response(s.AdapterSerializer(adapter).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.AdapterUpdateSerializer, responses=s.AdapterSerializer)
    def partial_update(self, request, pk=None):
        data = s.AdapterUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        adapter = adapter_update(actor=self.actor, adapter=self.get_object(), **data.validated_data)
        return Response(s.AdapterSerializer(adapter).data)

    def _replay(self, request, claim) -> Response:
        """Another request holds this key: hash this body (keeping none of it),
        then answer with that request's version once it commits."""
        digesting = install_digest_handler(request, keep=False)
        s.VersionRegisterSerializer(data=request.data).is_valid(raise_exception=True)
        version = idempotency_result(claim=claim, digest=request_digest(request, digesting))
        body = s.VersionSerializer(version).data
        body["warnings"] = []
        return Response(body, status=status.HTTP_200_OK, headers={"Idempotent-Replayed": "true"})

    @extend_schema(
        methods=["GET"],
        responses=s.VersionSerializer(many=True),
        parameters=[OpenApiParameter("status", str, many=True, enum=VersionStatus.values)],
    )
    @extend_schema(
        methods=["POST"],
        request={
            "multipart/form-data": s.VersionUploadSerializer,
            "application/json": s.VersionFromS3Serializer,
        },
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description=(
                    "Retries with the same key and the same request return the first "
                    "result (200, Idempotent-Replayed: true); the same key with another "
                    "body is 409 idempotency_key_reused."
                ),
            )
        ],
        responses={201: s.VersionSerializer, 200: s.VersionSerializer},
    )
    @accepts_large_body
    @action(detail=True, methods=["get", "post"])
    def versions(self, request, pk=None):
        adapter = self.get_object()
        if request.method == "GET":
            found = VersionFilter(
                request.query_params, selectors.versions_for(self.actor).filter(adapter=adapter)
            )
            if not found.is_valid():  # as the filter backend does for /versions/
                raise drf_exceptions.ValidationError(found.errors)
            rows = found.qs
            page = self.paginate_queryset(rows)
            return self.get_paginated_response(s.VersionSerializer(page, many=True).data)
        # Checked before the body is read: loose files are streamed into the
        # store while they arrive, so an outsider's upload must never start.
        require_contributor(self.actor, adapter.department_id, Ability.REGISTER_VERSIONS, "Adapter")
        key = request.headers.get("Idempotency-Key")
        claim = idempotency_claim(adapter=adapter, key=key) if key is not None else None
        if claim is not None and not claim.won:
            return self._replay(request, claim.claim)
        claim = claim.claim if claim else None
        streaming = install_streaming_handler(
            request,
            prefix=version_prefix(adapter),
            store=get_artifact_store(),
            limits=ingest_limits(),
            staging_root=settings.INGEST_STAGING_DIR,
        )
        digesting = install_digest_handler(request, keep=True) if claim else None
        try:
            data = s.VersionRegisterSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            values = data.validated_data
            if claim is not None:
                idempotency_bind(claim=claim, digest=request_digest(request, digesting))
            result = version_register(
                actor=self.actor,
                adapter=adapter,
                source=_artifact_source(request.FILES.getlist("files"), values, streaming),
                idempotency_key=key,
                idempotency_claim=claim,
                lineage=Lineage(
                    mlflow_run_id=values.get("mlflow_run_id", ""),
                    mlflow_run_uri=values.get("mlflow_run_uri", ""),
                    source_commit=values.get("source_commit", ""),
                    dataset=values.get("dataset", ""),
                ),
            )
            if claim is not None and not result.created:
                # Resolved to an earlier version (same MLflow run, or a key used
                # before claims existed): later retries get that one too.
                idempotency_complete(claim=claim, version=result.version)
        except BaseException:
            if streaming is not None:
                streaming.discard()
            if claim is not None:
                idempotency_release(claim=claim)
            raise
        finally:
            if streaming is not None:
                streaming.close()
        body = s.VersionSerializer(result.version).data
        body["warnings"] = result.warnings
        return Response(
            body,
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
            headers={} if result.created else {"Idempotent-Replayed": "true"},
        )


def _artifact_source(uploads, values, streaming):
    """The one source a registration request names: its files (streamed when
    they were), else its s3_uri, else none."""
    if uploads:
        streamed = streaming.artifact(uploads) if streaming is not None else None
        return streamed or UploadedFiles(uploads)
    if values.get("s3_uri") is not None:
        return S3Prefix(values["s3_uri"])
    return None


def _transition_action(name: str, doc: str):
    body = s.RejectSerializer if name == "reject" else s.TransitionSerializer

    def handler(self, request, pk=None):
        data = body(data=request.data)
        data.is_valid(raise_exception=True)
        version = version_transition(
            actor=self.actor,
            version=self.get_object(),
            action=name,
            comment=data.validated_data["comment"],
        )
        return Response(s.VersionSerializer(version).data)

    # DRF maps HTTP methods to the function's name, so it must be set before @action.
    handler.__name__ = name
    handler = action(detail=True, methods=["post"], url_path=name, url_name=name)(handler)
    return extend_schema(request=body, responses=s.VersionSerializer, description=doc)(handler)


class VersionViewSet(ActorMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.VersionSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = AdapterVersion.objects.none()
    filterset_class = VersionFilter
    ordering_fields = ["number", "created_at", "status"]

    def get_queryset(self):
        if schema_only(self):
            return AdapterVersion.objects.none()
        return selectors.versions_for(self.actor)

    def get_object(self):
        return selectors.version_get(self.actor, self.lookup_id())

    submit = _transition_action("submit", "registered → pending_review.")
    approve = _transition_action(
        "approve", "pending_review → approved. Approvers only; never the registrant or submitter."
    )
    reject = _transition_action("reject", "pending_review → rejected. A comment is required.")
    deprecate = _transition_action("deprecate", "approved → deprecated. Retires it from serving.")
    archive = _transition_action("archive", "deprecated → archived.")


class ArtifactSourceFilter(StrictFilterSet):
    # By id, not a model choice: an unknown id matches nothing (an empty page),
    # as every other id filter does, instead of a 400 the schema cannot predict.
    department = IntegerFilter(field_name="department_id")

    class Meta:
        model = ArtifactSource
        fields = ["department"]


class ArtifactSourceViewSet(ActorMixin, viewsets.ModelViewSet):
    """Where each department may register from S3 (and MLflow runs stored in
    S3): platform admins only. Secrets are write-only."""

    serializer_class = s.ArtifactSourceSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = ArtifactSource.objects.none()
    filterset_class = ArtifactSourceFilter
    ordering_fields = ["uri_prefix", "created_at"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        require_platform_admin(self.actor)
        return ArtifactSource.objects.select_related("department")

    def get_object(self):
        source = self.get_queryset().filter(pk=self.lookup_id()).first()
        if source is None:
            raise NotFound("Artifact source not found.")
        return source

    def create(self, request):
        require_platform_admin(self.actor)
        data = s.ArtifactSourceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        values["department"] = Department.objects.filter(slug=values["department"]).first()
        if values["department"] is None:
            raise NotFound("No such department.", code="department_not_found")
        source = artifact_source_create(actor=self.actor, **values)
        return Response(s.ArtifactSourceSerializer(source).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        source = self.get_object()
        data = s.ArtifactSourceSerializer(source, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        values.pop("department", None)  # a source does not move between departments
        source = artifact_source_update(actor=self.actor, source=source, **values)
        return Response(s.ArtifactSourceSerializer(source).data)

    def destroy(self, request, pk=None):
        artifact_source_delete(actor=self.actor, source=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
