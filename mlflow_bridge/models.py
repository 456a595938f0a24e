"""Mirror state: what the MLflow Model Registry should show, and whether it does.

Each row holds a desired state (the version's current status; the version an
alias should point at) and a `generation` bumped whenever that desire changes.
A sync marks the row synced only if the generation it pushed is still current,
so a change that lands mid-sync is never reported as synced.
"""

from __future__ import annotations

from django.db import models


class MirrorState(models.TextChoices):
    PENDING = "pending", "Pending"
    SYNCED = "synced", "Synced"
    FAILED = "failed", "Failed"


class MirrorRow(models.Model):
    state = models.CharField(
        max_length=16, choices=MirrorState.choices, default=MirrorState.PENDING
    )
    generation = models.PositiveIntegerField(default=1)
    synced_generation = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts since the last success.")
    last_error = models.TextField(blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    # A worker claims a row for a bounded time (core.claims), so two workers
    # never create the same MLflow model version twice; a crashed worker's
    # claim simply expires, and only the holder may let go of it.
    claimed_by = models.CharField(max_length=100, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class MlflowVersionMirror(MirrorRow):
    """One registry version ↔ one MLflow model version of `<department>.<adapter>`."""

    version = models.OneToOneField(
        "registry.AdapterVersion", on_delete=models.CASCADE, related_name="mlflow_mirror"
    )
    registered_model = models.CharField(max_length=256, blank=True)
    model_version = models.CharField(max_length=32, blank=True)
    synced_status = models.CharField(max_length=20, blank=True)

    class Meta:
        db_table = "registry_mlflowversionmirror"
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"MLflow mirror of version {self.version_id}: {self.state}"


class MlflowAliasMirror(MirrorRow):
    """One deployment ↔ one alias on the adapter's registered model.

    `version` is what the deployment is meant to serve; NULL means the alias
    must not exist (the deployment stopped serving this adapter).
    """

    adapter = models.ForeignKey(
        "registry.Adapter", on_delete=models.CASCADE, related_name="mlflow_aliases"
    )
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="mlflow_aliases"
    )
    alias = models.CharField(max_length=200)
    version = models.ForeignKey(
        "registry.AdapterVersion",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="mlflow_aliases",
    )

    class Meta:
        db_table = "registry_mlflowaliasmirror"
        constraints = [
            models.UniqueConstraint(fields=["adapter", "alias"], name="mlflow_alias_per_adapter")
        ]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"MLflow alias {self.alias} of adapter {self.adapter_id}: {self.state}"
