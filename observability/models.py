"""What the control plane observes about itself and its vLLM replicas.

Prometheus reads everything from the database at scrape time (observability.
collector), so these rows are the only state: whichever gunicorn worker or
Celery process answers /metrics, it tells the same story, and a counter never
restarts with a process.
"""

from __future__ import annotations

from django.db import models

# Upper bounds (seconds) of the reconcile duration histogram; counts are per bucket, not cumulative.
RECONCILE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ReconcileStats(models.Model):
    """Running totals of one deployment's reconciles. The reconcile lease
    serialises the writers, so a plain read-modify-write under a row lock is enough."""

    deployment = models.OneToOneField(
        "serving.Deployment", on_delete=models.CASCADE, related_name="reconcile_stats"
    )
    runs = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    duration_seconds_sum = models.FloatField(default=0.0)
    # One count per RECONCILE_BUCKETS bound, plus one for +Inf.
    duration_buckets = models.JSONField(default=list)
    last_duration_seconds = models.FloatField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # HttpAttempt rows outside rollouts up to this id are in AttemptTally. Housekeeping
    # prunes those rows after a while; counting them here keeps the counter monotonic.
    tallied_attempt_id = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"reconcile stats of {self.deployment_id}"


class AttemptTally(models.Model):
    """vLLM HTTP attempts made outside rollouts (reconcile polls, repairs, metrics
    scrapes), counted per purpose and status before housekeeping prunes the rows."""

    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="attempt_tallies"
    )
    purpose = models.CharField(max_length=32)
    status = models.CharField(max_length=8)  # HTTP status code, or "error" without a response
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "purpose", "status"], name="one_tally_per_label"
            )
        ]

    def __str__(self) -> str:
        return f"{self.purpose} {self.status}: {self.count}"


class ReplicaLoraState(models.Model):
    """The last `vllm:lora_*` reading of one replica, and how busy it has been."""

    replica = models.OneToOneField(
        "serving.Replica", on_delete=models.CASCADE, related_name="lora_state"
    )
    observed_at = models.DateTimeField()
    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    max_lora = models.PositiveIntegerField(null=True, blank=True)
    running = models.JSONField(default=list, blank=True)
    waiting = models.JSONField(default=list, blank=True)
    # The value of vLLM's newest lora_requests_info series: when vLLM recorded that state.
    series_timestamp = models.FloatField(null=True, blank=True)
    # Newer vLLM only (vllm:lora_adapter_loaded); null when the replica does not export it.
    gpu_loaded = models.JSONField(null=True, blank=True)
    cpu_loaded = models.JSONField(null=True, blank=True)
    samples = models.PositiveBigIntegerField(default=0)
    peak_running = models.PositiveIntegerField(default=0)
    # Successful /metrics reads: counted here, not stored as an HttpAttempt row each
    # (failed reads are rows, with their error).
    ok_reads = models.PositiveBigIntegerField(default=0)
    waiting_samples = models.PositiveBigIntegerField(default=0)
    # {"<adapters running at once>": samples}, for the max_loras recommendation.
    concurrency = models.JSONField(default=dict, blank=True)
    # {"<adapter>": epoch seconds}: what the reconcile's weight check probed here
    # after its read, and until when vLLM may stamp those probes' label sets; the
    # next read leaves them out of clients' activity and demand.
    own_probes = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"LoRA state of replica {self.replica_id}"


class AdapterActivity(models.Model):
    """When vLLM last reported requests for an adapter on a deployment."""

    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="adapter_activity"
    )
    served_name = models.CharField(max_length=128)
    adapter = models.ForeignKey(
        "registry.Adapter",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="activity",
    )
    first_active_at = models.DateTimeField()
    last_active_at = models.DateTimeField()
    # Readings that showed the adapter with requests running (or waiting).
    active_samples = models.PositiveBigIntegerField(default=0)
    waiting_samples = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "served_name"], name="one_activity_per_adapter"
            )
        ]
        indexes = [models.Index(fields=["adapter", "last_active_at"])]

    def __str__(self) -> str:
        return f"{self.served_name} on {self.deployment_id}: {self.last_active_at}"


class FrontDoorReading(models.Model):
    """The last request counters read from a deployment's front door, per
    adapter: {"<served name>": [requests, errors_4xx, errors_5xx]}. The next
    reading adds only what grew since (observability.usage)."""

    deployment = models.OneToOneField(
        "serving.Deployment", on_delete=models.CASCADE, related_name="front_door_reading"
    )
    counters = models.JSONField(default=dict)
    read_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"front door counters of {self.deployment_id}"


class DailyUsage(models.Model):
    """Requests to one adapter through one deployment's front door on one day
    (UTC), per version served when they were counted. Tokens are not here: the
    front door does not read response bodies, and vLLM 0.32's token counters
    carry no adapter label (docs/operators/usage.md)."""

    day = models.DateField()
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="daily_usage"
    )
    department = models.ForeignKey(
        "core.Department", on_delete=models.CASCADE, related_name="daily_usage"
    )
    adapter = models.ForeignKey(
        "registry.Adapter", on_delete=models.CASCADE, related_name="daily_usage"
    )
    served_name = models.CharField(max_length=128)
    version = models.ForeignKey(
        "registry.AdapterVersion",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_usage",
    )
    # The version's number, 0 when none was served (retired): part of the key,
    # where a nullable foreign key would not match itself in a unique constraint.
    version_number = models.PositiveIntegerField(default=0)
    requests = models.PositiveBigIntegerField(default=0)
    errors_4xx = models.PositiveBigIntegerField(default=0)
    errors_5xx = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "deployment", "adapter", "version_number"],
                name="one_usage_row_per_day_and_version",
            )
        ]
        indexes = [models.Index(fields=["department", "day"])]
        ordering = ["day", "served_name", "version_number"]

    def __str__(self) -> str:
        return f"{self.served_name} v{self.version_number} on {self.day}: {self.requests}"


class MeteredRequest(models.Model):
    """One request a replica served, as vLLM reported it (its `llm_request`
    span): the ledger that makes a resent batch count once, and what the door's
    per-minute limits read. The caller and the version come from the request
    id the front door set (observability.metering); a request that did not come
    through a door has neither. Pruned after OBSERVABILITY_METERED_REQUEST_DAYS;
    the day rows (DailyTokens) stay."""

    request_id = models.CharField(max_length=255)
    # The span's id (hex): the `n` choices of one request share its request id.
    span_id = models.CharField(max_length=16, default="", blank=True)
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="metered_requests"
    )
    # When vLLM took it (None: recorded before this was kept): the reconcile of
    # vLLM's counters against spans settles by it (observability.reconcile).
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    key = models.ForeignKey(
        "serving.InferenceKey",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="metered_requests",
    )
    # The key's department when it called: who is charged.
    department = models.ForeignKey(
        "core.Department",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="metered_requests",
    )
    version = models.ForeignKey(
        "registry.AdapterVersion",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="metered_requests",
    )
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["request_id", "span_id"], name="one_metered_row_per_span"
            )
        ]
        indexes = [
            models.Index(fields=["key", "finished_at"]),
            models.Index(fields=["department", "finished_at"]),
            models.Index(fields=["finished_at"]),
            models.Index(fields=["deployment", "started_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.prompt_tokens}+{self.completion_tokens}"


class DailyTokens(models.Model):
    """Requests and tokens vLLM served on one deployment on one day (UTC), per
    calling key and adapter version: the sum of that day's MeteredRequest rows,
    added in the transaction that wrote them. `key_ref` and `version_ref` are
    the ids, 0 for none (a nullable foreign key does not match itself in a
    unique constraint): no key (an open door, or a request that bypassed the
    door), no version (the base model)."""

    day = models.DateField()
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="daily_tokens"
    )
    key_ref = models.PositiveBigIntegerField(default=0)
    version_ref = models.PositiveBigIntegerField(default=0)
    key = models.ForeignKey(
        "serving.InferenceKey",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_tokens",
    )
    # Who called (the key's department) and who owns what was called.
    department = models.ForeignKey(
        "core.Department",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_tokens_called",
    )
    owner = models.ForeignKey(
        "core.Department",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_tokens_owned",
    )
    adapter = models.ForeignKey(
        "registry.Adapter",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_tokens",
    )
    version = models.ForeignKey(
        "registry.AdapterVersion",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="daily_tokens",
    )
    # The adapter's served name, or the deployment's base model.
    served_name = models.CharField(max_length=128)
    version_number = models.PositiveIntegerField(default=0)
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "deployment", "key_ref", "version_ref"],
                name="one_tokens_row_per_day_key_and_version",
            )
        ]
        indexes = [
            models.Index(fields=["department", "day"]),
            models.Index(fields=["owner", "day"]),
            models.Index(fields=["adapter", "day"]),
        ]
        ordering = ["day", "served_name", "version_number"]

    def __str__(self) -> str:
        return f"{self.served_name} v{self.version_number} on {self.day}: {self.tokens} tokens"

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class MeteringState(models.Model):
    """Per deployment: when its replicas last sent a span (whether it is metered
    at all), and the reconcile of vLLM's own token counters against its spans
    (observability.unmetered): what the replicas counted and no span reported
    (streams the client aborted) is charged to the deployment's unattributed
    tokens. docs/operators/usage.md, "Aborted streams"."""

    deployment = models.OneToOneField(
        "serving.Deployment", on_delete=models.CASCADE, related_name="metering_state"
    )
    # Written by the OTLP receiver.
    last_span_at = models.DateTimeField(null=True, blank=True)
    # Tokens of spans recorded after the window they started in was settled
    # (a request longer than the settling delay): the receiver adds, the reconcile
    # subtracts what it has not applied yet. Two columns each so that neither
    # writer overwrites the other's.
    late_prompt = models.BigIntegerField(default=0)
    late_completion = models.BigIntegerField(default=0)
    late_applied_prompt = models.BigIntegerField(default=0)
    late_applied_completion = models.BigIntegerField(default=0)
    # The reconcile's, under its claim: each replica's last counters
    # ({replica id: [prompt, generation]}), their growth summed since the
    # baseline, and readings waiting to be settled ([[epoch, prompt, completion]]).
    counters = models.JSONField(default=dict, blank=True)
    counted_prompt = models.BigIntegerField(default=0)
    counted_completion = models.BigIntegerField(default=0)
    counted_at = models.DateTimeField(null=True, blank=True)
    pending = models.JSONField(default=list, blank=True)
    # The last settled reading (None: no baseline yet), the counted-minus-reported
    # deficit there, and the most of it charged so far.
    settled_at = models.DateTimeField(null=True, blank=True)
    settled_prompt = models.BigIntegerField(default=0)
    settled_completion = models.BigIntegerField(default=0)
    deficit_prompt = models.BigIntegerField(default=0)
    deficit_completion = models.BigIntegerField(default=0)
    charged_prompt = models.BigIntegerField(default=0)
    charged_completion = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"metering of {self.deployment_id}"


class UnattributedTokens(models.Model):
    """Tokens a deployment's replicas counted (vllm:*_tokens_total) that no span
    reported, per day (UTC): requests vLLM did not finish (a client that aborted
    its stream), which no key or department can be told apart for."""

    day = models.DateField()
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="unattributed_tokens"
    )
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "deployment"], name="one_unattributed_row_per_day"
            )
        ]
        ordering = ["day"]

    def __str__(self) -> str:
        return f"{self.deployment_id} on {self.day}: {self.tokens} unattributed tokens"

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
