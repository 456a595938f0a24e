"""Shapes of API payloads. No business rules here: inputs are parsed, then
handed to services."""

from __future__ import annotations

from rest_framework import serializers

from core.models import Ability, ApiToken, AuditEvent, Department, Membership, Role
from registry.lineage import run_ui_url
from registry.models import Adapter, AdapterVersion, ArtifactSource
from registry.transitions import allowed_actions_from


class DepartmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Department
        fields = ["id", "slug", "name", "created_at"]


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "department", "role", "created_at"]


class MembershipInputSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


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
    served_name = serializers.CharField(max_length=128, required=False)
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
    s3_uri = serializers.CharField(required=False, max_length=1000)
    mlflow_run_id = serializers.CharField(required=False, allow_blank=True, max_length=64)
    mlflow_run_uri = serializers.CharField(required=False, allow_blank=True, max_length=1000)
    source_commit = serializers.CharField(required=False, allow_blank=True, max_length=100)
    dataset = serializers.CharField(required=False, allow_blank=True, max_length=300)


class TransitionSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)


class AuditEventSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor",
            "action",
            "department",
            "object_type",
            "object_id",
            "object_repr",
            "from_state",
            "to_state",
            "comment",
            "request_id",
            "client_address",
            "details",
        ]


class TokenSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    service_account = serializers.StringRelatedField(
        read_only=True, help_text="department/name when the token acts as a service account"
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "department",
            "service_account",
            "abilities",
            "created_by",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
        ]


class TokenCreateSerializer(serializers.Serializer):
    department = serializers.SlugField()
    name = serializers.CharField(max_length=100)
    abilities = serializers.ListField(
        child=serializers.ChoiceField(choices=Ability.choices), allow_empty=False
    )
    expires_in_days = serializers.IntegerField(required=False, min_value=1)


class TokenCreatedSerializer(TokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once. Store it now.")

    class Meta(TokenSerializer.Meta):
        fields = TokenSerializer.Meta.fields + ["secret"]


class ArtifactSourceSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", queryset=Department.objects.all())
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
