"""Mirror state: what the MLflow Model Registry should show, and whether it does.

Each row holds a desired state (the version's current status; the version an
alias should point at) and a `generation` bumped whenever that desire changes.
A sync marks the row synced only if the generation it pushed is still current,
so a change that lands mid-sync is never reported as synced.
"""

from __future__ import annotations

from django.conf import settings
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


class WebhookEvent(models.TextChoices):
    """The MLflow 3 webhook events the registry acts on (entity.action)."""

    VERSION_CREATED = "model_version.created", "A model version is created"
    ALIAS_CREATED = "model_version_alias.created", "An alias is set on a model version"


class WebhookRule(models.Model):
    """Which MLflow events register a version for a department's adapters, set by a
    platform admin (Django admin, audited). An event acts only through a rule."""

    department = models.ForeignKey(
        "core.Department", on_delete=models.CASCADE, related_name="mlflow_webhook_rules"
    )
    event = models.CharField(max_length=40, choices=WebhookEvent.choices)
    alias = models.CharField(
        max_length=200,
        blank=True,
        help_text="For alias events: the alias that registers (e.g. 'candidate'). "
        "Aliases the registry mirrors for deployments never do.",
    )
    artifact_path = models.CharField(
        max_length=500,
        default="adapter",
        help_text="Where runs log the adapter, when the model version's source does not say.",
    )
    submit = models.BooleanField(
        default=False, help_text="Also submit the registered version for review."
    )
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        "auth.User", on_delete=models.PROTECT, related_name="mlflow_webhook_rules"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["department", "event", "alias"], name="one_webhook_rule_per_event"
            ),
            models.CheckConstraint(
                condition=~models.Q(event="model_version_alias.created", alias=""),
                name="alias_rule_names_its_alias",
            ),
        ]

    def __str__(self) -> str:
        alias = f" {self.alias!r}" if self.alias else ""
        return f"{self.department.slug}: {self.event}{alias}"


class DeliveryStatus(models.TextChoices):
    ACCEPTED = "accepted", "Accepted, waiting for the worker"
    REGISTERED = "registered", "Registered a version"
    IGNORED = "ignored", "Ignored (no rule, no adapter, or the registry's own change)"
    FAILED = "failed", "Failed"
    REFUSED = "refused", "Refused (signature, timestamp or replay)"


class WebhookDelivery(models.Model):
    """One delivery MLflow accepted: the record of what arrived, and the replay
    guard (an accepted delivery id is never accepted twice). Refused deliveries
    are counted in WebhookRefusalCount instead (rows `refused` are from before)."""

    delivery_id = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices)
    event = models.CharField(max_length=80, blank=True)
    model_name = models.CharField(max_length=256, blank=True)
    model_version = models.CharField(max_length=32, blank=True)
    alias = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    detail = models.TextField(blank=True)
    rule = models.ForeignKey(WebhookRule, null=True, blank=True, on_delete=models.SET_NULL)
    version = models.ForeignKey(
        "registry.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL
    )
    received_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery_id"],
                condition=~models.Q(status="refused"),
                name="a_delivery_is_accepted_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id} {self.event} ({self.status})"


class WebhookRefusalCount(models.Model):
    """The webhook deliveries refused from one source in one window, as counts,
    not a row each: past MLFLOW_WEBHOOK_REFUSALS_PER_SOURCE the source is
    throttled (429, counted here too), and once the window has closed one chained
    audit event records the row (webhooks.webhook_refusals_audit). A forger's
    thousand deliveries cost the log one event, and the chain's lock once."""

    window_start = models.DateTimeField()
    # The client's address (core.actors.client_address_of); "-" when unknown.
    source = models.CharField(max_length=64)
    refused = models.PositiveIntegerField(default=0)
    throttled = models.PositiveIntegerField(default=0)
    codes = models.JSONField(default=dict, blank=True, help_text="Refusals by reason.")
    audited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-window_start", "source"]
        constraints = [
            models.UniqueConstraint(
                fields=["window_start", "source"], name="one_refusal_count_per_source_and_window"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source} at {self.window_start:%Y-%m-%d %H:%M:%S}"


class AllowedExperiment(models.Model):
    """An MLflow experiment whose runs a department may register from, set by a
    platform admin (mlflow_bridge.experiments), like an S3 artifact source. A
    run in any other experiment is, to that department, a run that does not exist."""

    department = models.ForeignKey(
        "core.Department", on_delete=models.PROTECT, related_name="mlflow_experiments"
    )
    # MLflow's id: names can be changed, ids cannot.
    experiment_id = models.CharField(max_length=64)
    experiment_name = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["department__slug", "experiment_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["department", "experiment_id"], name="one_grant_per_experiment"
            )
        ]

    def __str__(self) -> str:
        return f"{self.experiment_name or self.experiment_id} for {self.department.slug}"
