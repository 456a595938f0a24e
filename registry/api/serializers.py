"""Shapes of API payloads. No business rules here: inputs are parsed, then
handed to services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.lineage import run_ui_url
from registry.models import SERVED_NAME_PATTERN, Adapter, AdapterVersion, ArtifactSource
from registry.source_policy import S3_URI_PATTERN
from registry.transitions import allowed_actions_from


@extend_schema_field({"type": "string", "maxLength": 1000, "pattern": S3_URI_PATTERN})
class S3UriField(serializers.CharField):
    """Checked (and normalized) by registry.sources, whose error names the rule
    broken; the schema states the same rules as a pattern."""

    def __init__(self, **kwargs):
        super().__init__(max_length=1000, **kwargs)


@extend_schema_field({"type": "string", "maxLength": 500, "pattern": r"^https?://"})
class EndpointUrlField(serializers.CharField):
    def __init__(self, **kwargs):
        super().__init__(max_length=500, **kwargs)


class DepartmentSlugField(serializers.SlugField):
    def to_representation(self, department):
        return department.slug


class AdapterSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owners = serializers.SlugRelatedField(slug_field="username", many=True, read_only=True)

    class Meta:
        model = Adapter
        fields = [
            "id",
            "department",
            "name",
            "description",
            "base_model",
            "served_name",
            "owners",
            "last_version_number",
            "created_at",
            "updated_at",
        ]


class AdapterCreateSerializer(serializers.Serializer):
    department = serializers.SlugField()
    name = serializers.SlugField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    base_model = serializers.CharField(max_length=300)
    # The model's validator, here so that the schema states it (pattern, length).
    served_name = serializers.RegexField(SERVED_NAME_PATTERN, max_length=128, required=False)
    owners = serializers.ListField(child=serializers.CharField(), required=False)


class AdapterUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(required=False, allow_blank=True)
    owners = serializers.ListField(child=serializers.CharField(), required=False)


class VersionSerializer(serializers.ModelSerializer):
    adapter = serializers.PrimaryKeyRelatedField(read_only=True)
    adapter_name = serializers.CharField(source="adapter.name", read_only=True)
    department = serializers.CharField(source="adapter.department.slug", read_only=True)
    served_name = serializers.CharField(source="adapter.served_name", read_only=True)
    # null until someone submits / reviews (and for rows whose user is gone).
    registered_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    submitted_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    reviewed_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    allowed_actions = serializers.SerializerMethodField()
    lineage = serializers.SerializerMethodField()

    class Meta:
        model = AdapterVersion
        fields = [
            "id",
            "adapter",
            "adapter_name",
            "department",
            "served_name",
            "number",
            "status",
            "allowed_actions",
            "artifact_uri",
            "files",
            "manifest_sha256",
            "total_size",
            "peft_type",
            "r",
            "lora_alpha",
            "target_modules",
            "base_model_name_or_path",
            "tensor_count",
            "parameter_count",
            "dtype",
            "serving_dtype",
            "estimated_memory_bytes",
            "layer_count",
            "module_shapes",
            "rank_pattern",
            "adapter_config",
            "registered_by",
            "submitted_by",
            "reviewed_by",
            "reviewed_at",
            "review_comment",
            "source_uri",
            "lineage",
            "created_at",
            "updated_at",
        ]

    def get_allowed_actions(self, version) -> list[str]:
        return allowed_actions_from(version.status)

    def get_lineage(self, version) -> dict:
        return {
            "mlflow_run_id": version.mlflow_run_id,
            "mlflow_run_uri": version.mlflow_run_uri,
            "mlflow_run_url": run_ui_url(version.mlflow_experiment_id, version.mlflow_run_id)
            or None,
            "mlflow_experiment_id": version.mlflow_experiment_id,
            "mlflow_experiment_name": version.mlflow_experiment_name,
            "mlflow_artifact_path": version.mlflow_artifact_path,
            "run_name": version.run_tags.get("mlflow.runName", ""),
            "source_commit": version.source_commit,
            "dataset": version.dataset,
            "dataset_digest": version.dataset_digest,
            "run_base_model": version.run_base_model,
            "run_metrics": version.run_metrics,
            "run_params": version.run_params,
            "run_tags": version.run_tags,
            "warnings": version.lineage_warnings,
        }


class VersionRegisterSerializer(serializers.Serializer):
    """Multipart: `files` (one archive or the adapter files). JSON: `s3_uri`."""

    # Empty files are judged by ingest, which names the problem ("empty_upload").
    files = serializers.ListField(
        child=serializers.FileField(allow_empty_file=True), required=False
    )
    s3_uri = S3UriField(required=False)
    mlflow_run_id = serializers.CharField(required=False, allow_blank=True, max_length=64)
    mlflow_run_uri = serializers.CharField(required=False, allow_blank=True, max_length=1000)
    source_commit = serializers.CharField(required=False, allow_blank=True, max_length=100)
    dataset = serializers.CharField(required=False, allow_blank=True, max_length=300)


class _LineageFields(serializers.Serializer):
    mlflow_run_id = serializers.CharField(required=False, allow_blank=True, max_length=64)
    mlflow_run_uri = serializers.CharField(required=False, allow_blank=True, max_length=1000)
    source_commit = serializers.CharField(required=False, allow_blank=True, max_length=100)
    dataset = serializers.CharField(required=False, allow_blank=True, max_length=300)


class VersionUploadSerializer(_LineageFields):
    """The schema of a multipart registration: the artifact is its files (one
    archive, or the adapter's files). Parsed by VersionRegisterSerializer."""

    files = serializers.ListField(child=serializers.FileField(), min_length=1)


class VersionFromS3Serializer(_LineageFields):
    """The schema of a JSON registration: the artifact is under `s3_uri`, inside
    one of the department's artifact sources. Parsed by VersionRegisterSerializer."""

    s3_uri = S3UriField()


class TransitionSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)


class ArtifactSourceSerializer(serializers.ModelSerializer):
    # A slug the view resolves: one that names no department is a 404.
    department = DepartmentSlugField()
    uri_prefix = S3UriField()
    endpoint_url = EndpointUrlField(required=False, allow_blank=True)
    secret_access_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, style={"input_type": "password"}
    )
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = ArtifactSource
        fields = [
            "id",
            "department",
            "uri_prefix",
            "endpoint_url",
            "region",
            "access_key_id",
            "secret_access_key",
            "has_secret",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def get_has_secret(self, source) -> bool:
        return bool(source.secret_access_key)
