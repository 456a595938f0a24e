"""The registry's records: adapters and their immutable versions, with the
lineage of each. Departments, people, tokens and the audit log live in core.

Behaviour lives in services.py (writes) and selectors.py (reads); these classes
only describe data and its invariants.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from core.fields import EncryptedTextField
from core.models import Department

SERVED_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
served_name_validator = RegexValidator(
    SERVED_NAME_PATTERN,
    "Use letters, digits, '.', '_' or '-', starting with a letter or digit (max 128).",
)


class Adapter(models.Model):
    department = models.ForeignKey(Department, on_delete=models.PROTECT, related_name="adapters")
    name = models.SlugField(max_length=100, help_text="Unique within the department.")
    description = models.TextField(blank=True)
    base_model = models.CharField(
        max_length=300,
        help_text="The base model this adapter targets, as named in vLLM or the hub.",
    )
    served_name = models.CharField(
        max_length=128,
        unique=True,
        validators=[served_name_validator],
        help_text='What clients put in "model". Unique across the registry.',
    )
    owners = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="owned_adapters", blank=True
    )
    # Version numbers come from this counter, bumped under a row lock, so that
    # numbers never repeat or skip even when registrations race.
    last_version_number = models.PositiveIntegerField(default=0, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["department", "name"], name="adapter_name_per_department"
            )
        ]
        ordering = ["department__slug", "name"]

    def __str__(self) -> str:
        return f"{self.department.slug}/{self.name}"


class VersionStatus(models.TextChoices):
    REGISTERED = "registered", "Registered"
    PENDING_REVIEW = "pending_review", "Pending review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    DEPRECATED = "deprecated", "Deprecated"
    ARCHIVED = "archived", "Archived"


class AdapterVersion(models.Model):
    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=20, choices=VersionStatus.choices, default=VersionStatus.REGISTERED
    )

    # Artifact: where it lives and what exactly it is.
    artifact_uri = models.CharField(max_length=1000)
    storage_prefix = models.CharField(max_length=500)
    files = models.JSONField(help_text="[{path, size, sha256}] for every file of the artifact.")
    manifest_sha256 = models.CharField(max_length=64)
    total_size = models.BigIntegerField()

    # Metadata parsed from the artifact itself, never from what the client claims.
    peft_type = models.CharField(max_length=32)
    r = models.PositiveIntegerField()
    lora_alpha = models.FloatField()
    target_modules = models.JSONField()
    base_model_name_or_path = models.CharField(max_length=300, blank=True)
    tensor_count = models.PositiveIntegerField()
    parameter_count = models.BigIntegerField()
    dtype = models.CharField(max_length=16)
    serving_dtype = models.CharField(max_length=16)
    estimated_memory_bytes = models.BigIntegerField()
    layer_count = models.PositiveIntegerField(default=0)
    module_shapes = models.JSONField(default=list)
    rank_pattern = models.JSONField(default=dict, blank=True)
    adapter_config = models.JSONField(default=dict)

    # Who and how.
    registered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="registered_versions",
    )
    registered_via_token = models.ForeignKey(
        "core.ApiToken", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    # Every person behind registering and submitting (core.actors.Actor.people),
    # recorded at each act: through a service account's token the users above
    # are the account's, and four-eyes must also refuse whoever created the
    # account or minted the token, even if those rows change later.
    author_ids = models.JSONField(default=list, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_comment = models.TextField(blank=True)
    # NULL, not "", so that the unique constraint ignores versions without a key.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    source_uri = models.CharField(
        max_length=1000,
        blank=True,
        help_text="Where the artifact was copied from, if not uploaded.",
    )

    # Lineage; the MLflow integration fills these from the training run.
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    mlflow_run_uri = models.CharField(max_length=1000, blank=True)
    source_commit = models.CharField(max_length=100, blank=True)
    dataset = models.CharField(max_length=300, blank=True)
    mlflow_experiment_id = models.CharField(max_length=64, blank=True)
    mlflow_experiment_name = models.CharField(max_length=500, blank=True)
    mlflow_artifact_path = models.CharField(max_length=500, blank=True)
    dataset_digest = models.CharField(max_length=100, blank=True)
    run_base_model = models.CharField(max_length=300, blank=True)
    # Snapshots taken at registration: they keep what the run said even if the
    # run is later edited or deleted in MLflow.
    run_metrics = models.JSONField(default=dict, blank=True)
    run_params = models.JSONField(default=dict, blank=True)
    run_tags = models.JSONField(default=dict, blank=True)
    lineage_warnings = models.JSONField(default=list, blank=True)

    # Set when the retention period of an archived version ran out and its files were
    # deleted from the artifact store (registry/services/retention.py); the row stays.
    artifacts_deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["adapter", "number"], name="version_number_per_adapter"
            ),
            models.UniqueConstraint(
                fields=["adapter", "manifest_sha256"],
                name="version_content_per_adapter",
            ),
            models.UniqueConstraint(
                fields=["adapter", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="version_idempotency_key_per_adapter",
            ),
        ]
        ordering = ["adapter_id", "-number"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"{self.adapter} v{self.number}"

    @property
    def authors(self) -> set[int]:
        """Who may not review this version (core.access.can_review)."""
        return {*self.author_ids, self.registered_by_id, self.submitted_by_id} - {None}

    @property
    def sha8(self) -> str:
        return self.manifest_sha256[:8]


class ArtifactSource(models.Model):
    """Where a department's artifacts may be read from by the server itself
    (s3_uri registrations, MLflow runs stored in S3): one allowed S3 prefix,
    and the credentials to read it with. Set by platform admins only; without
    one, a department cannot register from S3 at all. Blank connection fields
    fall back to the registry's own S3 settings (AWS_*)."""

    department = models.ForeignKey(
        Department, on_delete=models.CASCADE, related_name="artifact_sources"
    )
    uri_prefix = models.CharField(
        max_length=1000, help_text="s3://bucket/some/prefix/ (normalized to end with '/')."
    )
    endpoint_url = models.CharField(max_length=500, blank=True)
    region = models.CharField(max_length=64, blank=True)
    access_key_id = models.CharField(max_length=200, blank=True)
    # Encrypted at rest; never returned by the API or shown in the admin.
    secret_access_key = EncryptedTextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["department", "uri_prefix"], name="one_source_per_prefix"
            )
        ]
        ordering = ["department__slug", "uri_prefix"]

    def __str__(self) -> str:
        return f"{self.department.slug}: {self.uri_prefix}"


class IdempotencyClaim(models.Model):
    """An Idempotency-Key taken by the first request that sent it, before any
    ingest starts. The unique row is the claim: a concurrent request with the
    same key fails to insert it, waits for `version` to be set (in the
    transaction that creates the version) and answers with that version, but
    only if its own request digest is the same."""

    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    # sha256 over method, path and the content of the body; "" until the
    # winner has read its body.
    request_digest = models.CharField(max_length=64, blank=True)
    version = models.OneToOneField(
        AdapterVersion, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["adapter", "key"], name="one_claim_per_key")]

    def __str__(self) -> str:
        return f"{self.adapter_id}:{self.key}"
