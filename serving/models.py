"""The serving control plane's records.

Desired state is `ServedAdapter` (what each deployment is meant to serve).
Everything else records how we got there: promotions (with four-eyes approval
where policy asks), rollouts with one row per replica and every HTTP attempt,
reconcile drift events, and staged folders on the adapter volume.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.fields import EncryptedTextField
from core.models import Department, ServiceAccount
from registry.models import Adapter, AdapterVersion


class Deployment(models.Model):
    # The departments a create or update asked for, carried from validation to
    # the save (serving.services.deployments): a many-to-many waits for the row.
    _departments: list | None

    name = models.SlugField(max_length=100, unique=True)
    environment = models.CharField(max_length=32, default="staging")
    description = models.TextField(blank=True)

    # The base model: its served name in vLLM, other names it is known by, and its identity.
    base_model_name = models.CharField(max_length=300)
    base_model_aliases = models.JSONField(
        default=list, blank=True, help_text="Other names of the same weights (hub id, path)."
    )
    architecture = models.CharField(max_length=100, blank=True)
    hidden_size = models.PositiveIntegerField(null=True, blank=True)
    intermediate_size = models.PositiveIntegerField(null=True, blank=True)
    num_layers = models.PositiveIntegerField(null=True, blank=True)
    num_attention_heads = models.PositiveIntegerField(null=True, blank=True)
    num_key_value_heads = models.PositiveIntegerField(null=True, blank=True)
    vocab_size = models.PositiveIntegerField(null=True, blank=True)
    revision = models.CharField(max_length=100, blank=True)
    # {module: [in_features, out_features]} for every LoRA-targetable module.
    module_dims = models.JSONField(default=dict, blank=True)

    # Replicas: a static list, or a DNS name whose every A record is one replica.
    replica_urls = models.JSONField(default=list, blank=True)
    replica_dns_name = models.CharField(max_length=253, blank=True)
    replica_port = models.PositiveIntegerField(default=8000)
    replica_scheme = models.CharField(max_length=5, default="http")
    # Or the ready endpoints of the EndpointSlices matching a label selector in a
    # namespace, kept current by `manage.py watch_replicas` (serving/discovery/kubernetes.py).
    kubernetes_namespace = models.CharField(max_length=63, blank=True)
    kubernetes_label_selector = models.CharField(
        max_length=500,
        blank=True,
        help_text="Matched against EndpointSlice labels, e.g. "
        "serving.kserve.io/inferenceservice=granite-8b.",
    )
    # Only the slices the endpoint-slice controller keeps for this Service count:
    # a hand-made slice or another Service's pods with the same labels would
    # otherwise receive the vLLM API key.
    kubernetes_service_name = models.CharField(
        max_length=63,
        blank=True,
        help_text="The Service whose endpoints are the replicas, e.g. granite-8b-predictor.",
    )
    # Encrypted at rest; never returned by the API or shown in the admin.
    vllm_api_key = EncryptedTextField(blank=True)

    # vLLM's three tiers: max_loras adapters in one batch (GPU buffers preallocated),
    # max_cpu_loras cached in host memory (LRU), and every registered one, which vLLM
    # re-reads from its lora_path on its next request once evicted. Only the first two
    # are vLLM flags (--max-loras, --max-cpu-loras, with --max-lora-rank); the third is
    # the control plane's own limit on what one deployment is meant to serve.
    max_loras = models.PositiveIntegerField(default=4)
    max_cpu_loras = models.PositiveIntegerField(default=8)
    max_lora_rank = models.PositiveIntegerField(default=16)
    # Adapters with placement bounds that placement puts on one replica at most
    # (serving.rules.placement_plan); null: max_cpu_loras, so each replica's set stays within
    # vLLM's host cache. Above it vLLM evicts and re-reads from disk (LRU).
    placement_capacity = models.PositiveIntegerField(null=True, blank=True)
    max_registered_adapters = models.PositiveIntegerField(
        default=500,
        help_text="Adapters this deployment may serve at once. Above max_cpu_loras they are "
        "served too, at the cost of a cold load from the volume after an eviction.",
    )
    gpu_memory_bytes = models.BigIntegerField(null=True, blank=True)
    lora_memory_share = models.FloatField(default=0.15)

    # The adapter volume: where workers write, and where vLLM sees the same folder.
    volume_write_path = models.CharField(max_length=500)
    volume_serve_path = models.CharField(max_length=500)

    # What the rendered KServe ServingRuntime needs beyond the above (serving/kserve.py).
    runtime_image = models.CharField(
        max_length=500, blank=True, help_text="Empty means the KSERVE_VLLM_IMAGE setting."
    )
    base_model_pvc = models.CharField(max_length=253, blank=True)
    adapter_pvc = models.CharField(
        max_length=253, blank=True, help_text="The shared ReadWriteMany adapter volume's claim."
    )
    gpu_memory_utilization = models.FloatField(default=0.90)
    gpus = models.PositiveIntegerField(default=1)
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    # {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {...}}; empty means defaults.
    runtime_resources = models.JSONField(default=dict, blank=True)

    # Policy.
    requires_promotion_approval = models.BooleanField(default=False)
    allowed_departments = models.ManyToManyField(
        Department, blank=True, related_name="+", help_text="Empty means every department."
    )
    unload_unknown_adapters = models.BooleanField(default=False)
    canary_by_default = models.BooleanField(default=False)
    verify_with_completion = models.BooleanField(default=True)
    # An open front door takes every request without a key (a laptop). Never the
    # default: shown on the deployment's page and in /readyz while it is on.
    open_door = models.BooleanField(
        default=False,
        help_text="Take requests at the front door without an inference key. Only for a laptop.",
    )
    require_all_replicas = models.BooleanField(
        default=False,
        help_text="Push to replicas that are down too, retrying until the deadline, and fail "
        "the rollout if any stays down. Off: a replica already down when a rollout starts is "
        "deferred, and the reconcile loads and verifies the version when it is back.",
    )

    # Only one reconciler works on a deployment at a time, whatever beat and workers do.
    reconcile_lease_owner = models.CharField(max_length=100, blank=True, editable=False)
    reconcile_lease_until = models.DateTimeField(null=True, blank=True, editable=False)
    last_reconciled_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The served name whose weights the reconcile checked last on this deployment's
    # replicas: each tick checks the next few after it (serving/records/fingerprints.py).
    fingerprint_checked_through = models.CharField(max_length=200, blank=True, editable=False)

    # Quarantined after a restore (serving/services/restore.py): the id of the audit event
    # whose hash was shipped before the backup. While set, nothing is sent to this
    # deployment's replicas; cleared when what it serves and where match the chain up
    # to that event, or when a platform admin acknowledges the differences (audited).
    restore_basis = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    # Why it is quarantined: one sentence per difference from the chain.
    restore_differences = models.JSONField(default=list, blank=True, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["environment", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_memory_utilization__gt=0, gpu_memory_utilization__lte=1),
                name="gpu_memory_utilization_is_a_fraction",
            ),
            # A selector without a namespace would watch the whole cluster.
            models.CheckConstraint(
                condition=Q(kubernetes_label_selector="") | ~Q(kubernetes_namespace=""),
                name="kubernetes_selector_needs_namespace",
            ),
            # vLLM refuses to start with more GPU slots than CPU slots.
            models.CheckConstraint(
                condition=Q(max_loras__lte=models.F("max_cpu_loras")),
                name="max_loras_within_max_cpu_loras",
            ),
            models.CheckConstraint(
                condition=Q(lora_memory_share__gt=0, lora_memory_share__lte=1),
                name="lora_memory_share_is_a_fraction",
            ),
            # Zero would refuse every promotion; a deployment that should serve nothing
            # is retired, not limited to nothing.
            models.CheckConstraint(
                condition=Q(max_registered_adapters__gte=1),
                name="max_registered_adapters_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def uses_kubernetes(self) -> bool:
        return bool(self.kubernetes_namespace and self.kubernetes_label_selector)


class ReplicaHealth(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    UP = "up", "Up"
    DOWN = "down", "Down"


class Replica(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replicas")
    base_url = models.CharField(max_length=500)
    discovered_via = models.CharField(max_length=8, default="static")
    active = models.BooleanField(default=True)
    health = models.CharField(
        max_length=8, choices=ReplicaHealth.choices, default=ReplicaHealth.UNKNOWN
    )
    vllm_version = models.CharField(max_length=50, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # What /v1/models said at the last reconcile: [{id, root}] for adapters.
    loaded_adapters = models.JSONField(default=list, blank=True)
    # Reconcile polls that found the replica up and nothing to repair. They are
    # counted here instead of stored as one HttpAttempt row each (a row per
    # replica per tick is most of the table at fleet scale).
    in_sync_polls = models.PositiveBigIntegerField(default=0)
    in_sync_since = models.DateTimeField(null=True, blank=True)
    # What the replica itself says it serves, read by reconcile (serving.fact_readings):
    # {"base_model": served name, "root": model path} from /v1/models' base card and
    # {"max_lora": n} from the max_lora label of vllm:lora_requests_info.
    reported_facts = models.JSONField(default=dict, blank=True)
    # Demand for each adapter at the last /metrics reading, for placement
    # (serving.rules.placement_plan): {served name: 1 if listed running + 1 if listed waiting}.
    # Written by observability only when it changes, so an idle tick writes nothing.
    lora_demand = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "base_url"], name="replica_url_per_deployment"
            )
        ]
        ordering = ["deployment_id", "base_url"]

    def __str__(self) -> str:
        return self.base_url


class ServedAdapter(models.Model):
    """Desired state: the version of an adapter that a deployment is meant to serve.

    `version` moves only when a rollout succeeds or is rolled back; null means
    retired (must be unloaded). The lease serialises every push of this
    adapter to this deployment across workers and the reconciler.
    """

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="served_adapters"
    )
    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="served_in")
    version = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="served_in"
    )
    served_path = models.CharField(max_length=1000, blank=True)
    # A canary's split at the front door, {server: weight}, so that a reload of
    # the gateway keeps it; empty when no canary is baking (serving/rollouts/canary.py).
    gateway_weights = models.JSONField(default=dict, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # How many replicas hold it (serving.rules.placement_plan). Both null: every replica,
    # as before placement existed; a null min is the max.
    min_replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    max_replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    # Where it is placed and why (serving.rules.placement_plan.State.as_dict), written by the
    # reconcile where it changes and by a rollout for the adapter it holds.
    placement = models.JSONField(default=dict, blank=True, editable=False)
    # The replicas a swap behind a front door left on the version before, drained,
    # so that a rollback meanwhile is a switch of traffic (serving.rules.kept_copies:
    # {"path", "replicas", "until"}); the reconcile leaves those copies alone until then.
    kept_copy = models.JSONField(default=dict, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "adapter"], name="one_served_version"),
            models.CheckConstraint(
                condition=models.Q(min_replicas__isnull=True)
                | models.Q(max_replicas__isnull=True)
                | models.Q(min_replicas__lte=models.F("max_replicas")),
                name="served_min_replicas_le_max",
            ),
            models.CheckConstraint(
                condition=(models.Q(min_replicas__isnull=True) | models.Q(min_replicas__gte=1))
                & (models.Q(max_replicas__isnull=True) | models.Q(max_replicas__gte=1)),
                name="served_replicas_at_least_one",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment}: {self.adapter} -> {self.version or 'retired'}"


class PromotionStatus(models.TextChoices):
    PENDING_APPROVAL = "pending_approval", "Pending approval"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class Promotion(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="promotions")
    version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="promotions")
    status = models.CharField(max_length=20, choices=PromotionStatus.choices)
    # A canary asked for with the request is its own row (Canary.promotion),
    # which the rollout takes over when the approval starts it.
    gate_report = models.JSONField(default=list)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    # Every person behind the request (core.actors.Actor.people), recorded when
    # it is made: the requester, and through a service account's token whoever
    # minted the token and created the account.
    author_ids = models.JSONField(default=list, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "version"],
                condition=Q(status="pending_approval"),
                name="one_pending_promotion_per_version",
            )
        ]

    def __str__(self) -> str:
        return f"{self.version} -> {self.deployment}"

    @property
    def authors(self) -> set[int]:
        """Who may not review this request (core.access.can_review)."""
        return {*self.author_ids, self.requested_by_id}


class RolloutKind(models.TextChoices):
    PROMOTE = "promote", "Promote"
    SWAP = "swap", "Swap"
    ROLLBACK = "rollback", "Rollback"
    RETIRE = "retire", "Retire"


class RolloutStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    STAGING = "staging", "Staging"
    LOADING = "loading", "Loading"
    VERIFYING = "verifying", "Verifying"
    # A canary: the new version serves its share of the traffic on one replica
    # while the health gates compare it with the old one.
    BAKING = "baking", "Baking"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    CANCELLED = "cancelled", "Cancelled"


class Rollout(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="rollouts")
    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="rollouts")
    kind = models.CharField(max_length=10, choices=RolloutKind.choices)
    # Null target: unload (retire). Null previous: nothing was served before.
    target_version = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    previous_version = models.ForeignKey(
        AdapterVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    promotion = models.ForeignKey(
        Promotion, on_delete=models.PROTECT, null=True, blank=True, related_name="rollouts"
    )
    status = models.CharField(
        max_length=12, choices=RolloutStatus.choices, default=RolloutStatus.PENDING
    )
    staged_path = models.CharField(max_length=1000, blank=True)
    served_path = models.CharField(max_length=1000, blank=True)
    error = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When its task was last sent to the broker (at creation, then by the sweeper).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["deployment", "status"]),
            models.Index(fields=["status", "enqueued_at"]),
        ]

    def __str__(self) -> str:
        return f"rollout #{self.pk} {self.kind} {self.adapter} on {self.deployment}"


class CanaryState(models.TextChoices):
    """Where a canary is (serving.rules.transitions.CANARY_TRANSITIONS)."""

    # Asked for; the new version is not verified on its replica yet.
    WAITING = "waiting", "Waiting for its replica"
    # Verified on its replica and taking its share of the traffic.
    BAKING = "baking", "Baking"
    # A person's decision, which the worker carries out within a second.
    PROMOTE_ASKED = "promote_asked", "Promote asked"
    ABORT_ASKED = "abort_asked", "Abort asked"
    # Decided: then every replica (passed, promoted) or the canary pulled out.
    PASSED = "passed", "Gates passed"
    FAILED = "failed", "Gates failed"
    PROMOTED = "promoted", "Promoted by a person"
    ABORTED = "aborted", "Aborted by a person"
    # The rollout ended before anything was decided (cancelled, failed on its replica).
    ENDED = "ended", "Ended undecided"


# The API's words for a canary's state (CanarySplitSerializer): its outcome
# ("" while undecided) and a person's request not acted on yet.
class CanaryOutcome(models.TextChoices):
    UNDECIDED = "", "Undecided"
    PASSED = "passed", "Gates passed"
    FAILED = "failed", "Gates failed"
    PROMOTED = "promoted", "Promoted by a person"
    ABORTED = "aborted", "Aborted by a person"


class CanaryRequest(models.TextChoices):
    NONE = "", "None"
    PROMOTE = "promote", "Promote now"
    ABORT = "abort", "Abort"


class Canary(models.Model):
    """The new version on one replica first, verified there before the others.

    With a `share`, the front door sends it that percentage of the adapter's
    requests for `bake_seconds` while health gates compare it with the old
    version (serving/rollouts/canary.py); without one, its verification on
    that replica is the whole test. Asked for with a promotion, it belongs to
    the promotion until the rollout that carries it out starts. Its decision
    moves through CANARY_TRANSITIONS with compare-and-swap.
    """

    promotion = models.OneToOneField(
        "Promotion", on_delete=models.CASCADE, null=True, blank=True, related_name="canary"
    )
    rollout = models.OneToOneField(
        Rollout, on_delete=models.CASCADE, null=True, blank=True, related_name="canary"
    )
    share = models.PositiveSmallIntegerField(null=True, blank=True)
    bake_seconds = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(
        max_length=16, choices=CanaryState.choices, default=CanaryState.WAITING
    )
    # The worker's state, so that a worker killed mid-bake is resumed where it was.
    replica = models.ForeignKey(
        "Replica", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    bake_until = models.DateTimeField(null=True, blank=True)
    gates = models.JSONField(default=dict, blank=True)
    # Who decided: a person who promoted or aborted it; null when its gates
    # (or its verification) did.
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(promotion__isnull=False) | Q(rollout__isnull=False),
                name="canary_belongs_somewhere",
            ),
            # A share goes with a bake time; the canary is the minority.
            models.CheckConstraint(
                condition=Q(share__isnull=True, bake_seconds__isnull=True)
                | Q(share__gte=1, share__lte=50, bake_seconds__gte=1),
                name="canary_share_with_bake",
            ),
        ]

    def __str__(self) -> str:
        split = f"{self.share} % for {self.bake_seconds} s" if self.share else "one replica first"
        return f"canary ({split}): {self.state}"

    @property
    def outcome(self) -> str:
        """The API's outcome: "" until decided (CanaryOutcome)."""
        return self.state if self.state in CanaryOutcome.values else ""

    @property
    def requested(self) -> str:
        """A person's decision the worker has not acted on yet (CanaryRequest)."""
        asked: dict[str, str] = {
            CanaryState.PROMOTE_ASKED: CanaryRequest.PROMOTE,
            CanaryState.ABORT_ASKED: CanaryRequest.ABORT,
        }
        return asked.get(self.state, "")


class ReplicaStepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    # Down when the rollout started: not pushed to; the reconcile loads and
    # verifies the version when the replica is back.
    DEFERRED = "deferred", "Deferred (down)"
    LOADING = "loading", "Loading"
    VERIFYING = "verifying", "Verifying"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    CANCELLED = "cancelled", "Cancelled"


class ReplicaRollout(models.Model):
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="replica_steps")
    replica = models.ForeignKey(Replica, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(
        max_length=12, choices=ReplicaStepStatus.choices, default=ReplicaStepStatus.PENDING
    )
    error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rollout", "replica"], name="one_step_per_replica")
        ]
        ordering = ["rollout_id", "replica__base_url"]

    def __str__(self) -> str:
        return f"{self.rollout_id}@{self.replica_id}: {self.status}"


class HttpAttempt(models.Model):
    """Every call to a vLLM replica: rollouts, reconcile, retire."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="attempts")
    replica_rollout = models.ForeignKey(
        ReplicaRollout, on_delete=models.CASCADE, null=True, blank=True, related_name="attempts"
    )
    purpose = models.CharField(max_length=32)
    method = models.CharField(max_length=8)
    url = models.CharField(max_length=1000)
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    ok = models.BooleanField()
    transient = models.BooleanField(default=False)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["started_at", "id"]

    def __str__(self) -> str:
        return f"{self.method} {self.url} -> {self.status_code}"


class DriftKind(models.TextChoices):
    MISSING_RELOADED = "missing_reloaded", "Missing adapter reloaded"
    WRONG_ROOT_CORRECTED = "wrong_root_corrected", "Wrong path corrected"
    RETIRED_UNLOADED = "retired_unloaded", "Retired adapter unloaded"
    UNKNOWN_REPORTED = "unknown_reported", "Unknown adapter reported"
    UNKNOWN_UNLOADED = "unknown_unloaded", "Unknown adapter unloaded"
    REPAIR_FAILED = "repair_failed", "Repair failed"
    REPLICA_DOWN = "replica_down", "Replica down"
    REPLICA_UP = "replica_up", "Replica back up"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch", "Stale weights (fingerprint mismatch)"
    FACT_DISPUTED = "fact_disputed", "Replica disagrees with the deployment record"
    PLACED_LOADED = "placed_loaded", "Loaded and verified where placement put it"
    UNPLACED_UNLOADED = "unplaced_unloaded", "Unloaded where placement no longer puts it"


class DriftEvent(models.Model):
    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="drift_events"
    )
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="drift_events")
    kind = models.CharField(max_length=24, choices=DriftKind.choices)
    adapter_name = models.CharField(max_length=200, blank=True)
    expected_root = models.CharField(max_length=1000, blank=True)
    actual_root = models.CharField(max_length=1000, blank=True)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The same drift found again on later ticks (a repair that keeps failing, a
    # replica still down) is this one event seen `count` times, not a row per tick.
    count = models.PositiveIntegerField(default=1)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-last_seen_at", "-id"]
        indexes = [
            # The reconcile looks up the latest event of each (replica, adapter) it drifts on.
            models.Index(
                fields=["replica", "adapter_name", "-id"], name="drift_latest_per_adapter"
            ),
            models.Index(fields=["deployment", "-last_seen_at"], name="drift_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.adapter_name} on {self.replica_id}"


class StagedFolder(models.Model):
    """A version's files on a deployment's adapter volume. Deleted only after a
    grace period once nothing references it: vLLM re-reads evicted adapters."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="staged")
    version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    write_path = models.CharField(max_length=1000)
    serve_path = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)
    unreferenced_since = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # When every file's sha256 was last checked, and each file's (size, mtime_ns)
    # then: a repair re-hashes only if these differ or the check is older than
    # SERVING_STAGED_REVERIFY_SECONDS.
    verified_at = models.DateTimeField(null=True, blank=True)
    verified_stat = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "version"], name="one_folder_per_version")
        ]

    def __str__(self) -> str:
        return self.write_path


class VersionFingerprint(models.Model):
    """What a version's adapter does to the probe (serving/rules/probe.py) on a
    deployment: the first verified replica's answer. Per deployment, because the
    base weights and the hardware that shape the numbers belong to the deployment.
    Every other replica, and every later check by the reconcile, must match it."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="fingerprints"
    )
    version = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="+")
    # {"tokens": [...], "logprobs": [...]}: Probe.as_dict().
    probe = models.JSONField()
    recorded_from = models.ForeignKey(
        Replica, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Kept as text too: a replica that discovery dropped leaves its URL here.
    recorded_from_url = models.CharField(max_length=500, blank=True)
    # The rollout whose verification recorded it: if that rollout then finds a replica
    # disagreeing, nobody can tell which side is right, and it drops its own record.
    rollout = models.ForeignKey(
        Rollout, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "version"], name="one_fingerprint_per_version"
            )
        ]

    def __str__(self) -> str:
        return f"fingerprint of {self.version_id} on {self.deployment_id}"


class ManifestRender(models.Model):
    """A KServe export someone downloaded: the versions its --lora-modules name. The
    volume GC keeps their staged folders (serving/volume.py): a pod started from
    that manifest reads them, whether or not the control plane still serves them."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="manifest_renders"
    )
    version_ids = models.JSONField(default=list)
    rendered_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rendered_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-rendered_at", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_id} manifest at {self.rendered_at:%Y-%m-%d %H:%M}"


class AdoptionStatus(models.TextChoices):
    PENDING_APPROVAL = "pending_approval", "Registered, waiting for approval"
    SERVED = "served", "Served (under management)"
    REJECTED = "rejected", "Rejected"


class Adoption(models.Model):
    """An adapter already loaded on a deployment's replicas (a stray) brought under
    management: registered through the normal ingest from the folder vLLM reads it
    from, approved by four eyes, then recorded as served where it already is, with no
    reload. Until then the reconcile reports it and leaves it loaded."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="adoptions")
    served_name = models.CharField(max_length=128)
    lora_path = models.CharField(max_length=1000, help_text="The root the replicas report.")
    adapter = models.ForeignKey(Adapter, on_delete=models.PROTECT, related_name="adoptions")
    version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="adoptions")
    status = models.CharField(max_length=20, choices=AdoptionStatus.choices)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "served_name"],
                condition=models.Q(status="pending_approval"),
                name="one_pending_adoption_per_name",
            )
        ]

    def __str__(self) -> str:
        return f"adopt {self.served_name} on {self.deployment_id} ({self.status})"


class InferenceKey(models.Model):
    """A key a client sends to a deployment's front door (`Authorization: Bearer`).

    It calls as its department, whoever holds it: issued to the department
    itself, to one of its service accounts, or to a person (who must stay an
    active member). Only its SHA-256 is stored; the secret is shown once.
    What it may call is serving.door.selectors.door_access."""

    department = models.ForeignKey(
        Department, on_delete=models.PROTECT, related_name="inference_keys"
    )
    # At most one of these: neither means the department's own key.
    service_account = models.ForeignKey(
        ServiceAccount,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="inference_keys",
    )
    person = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="inference_keys",
    )
    name = models.CharField(max_length=100)
    # The first characters of the secret: tells keys apart in lists, reveals nothing.
    prefix = models.CharField(max_length=16, db_index=True)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    revoked_reason = models.CharField(max_length=200, blank=True)
    # Set by its department's approvers, never above the department's own
    # (serving/services/limits.py); empty: only the department's limit applies.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(service_account__isnull=True) | Q(person__isnull=True),
                name="inference_key_one_holder",
            ),
            models.CheckConstraint(
                condition=Q(requests_per_minute__isnull=True) | Q(requests_per_minute__gt=0),
                name="inference_key_rpm_positive",
            ),
            models.CheckConstraint(
                condition=Q(tokens_per_minute__isnull=True) | Q(tokens_per_minute__gt=0),
                name="inference_key_tpm_positive",
            ),
        ]
        indexes = [models.Index(fields=["revoked_at", "expires_at"], name="inference_key_live")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def holder_kind(self) -> str:
        if self.service_account_id:
            return "service_account"
        return "person" if self.person_id else "department"


class GrantStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved"
    REFUSED = "refused", "Refused"
    REVOKED = "revoked", "Revoked"
    EXPIRED = "expired", "Expired"


class AdapterGrant(models.Model):
    """Another department may call this adapter through the front door.

    Asked by a member of the calling department, approved by an approver of the
    adapter's department who did not ask (four eyes), until `expires_at`; either
    side's approvers may revoke it. The states are serving.rules.transitions.GRANT_TRANSITIONS."""

    # Null when no adapter had the asked name: the request is kept all the same,
    # answered like any other, seen only by the asking department, and never
    # approvable; it expires on the tick (docs/security.md, "Grant requests").
    # An adapter served later under that name does not pick it up.
    adapter = models.ForeignKey(
        Adapter, on_delete=models.PROTECT, related_name="grants", null=True, blank=True
    )
    # The name asked for, as asked: the only trace of what a request without an
    # adapter named.
    served_name = models.CharField(max_length=128)
    # The calling department: its keys may call the adapter once approved.
    department = models.ForeignKey(
        Department, on_delete=models.PROTECT, related_name="adapter_grants"
    )
    status = models.CharField(
        max_length=12, choices=GrantStatus.choices, default=GrantStatus.REQUESTED
    )
    reason = models.TextField(blank=True)
    expires_at = models.DateTimeField()
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    # Every person behind the request (core.actors.Actor.people), as promotions keep.
    author_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One live grant (asked or approved) per adapter and calling department.
            models.UniqueConstraint(
                fields=["adapter", "department"],
                condition=Q(status__in=["requested", "approved"]),
                name="one_live_grant_per_adapter_department",
            ),
            # The same for requests that name no adapter: a repeat is a 409 as above.
            models.UniqueConstraint(
                fields=["served_name", "department"],
                condition=Q(adapter__isnull=True, status__in=["requested", "approved"]),
                name="one_live_unknown_grant_per_name_department",
            ),
        ]
        indexes = [models.Index(fields=["status", "expires_at"], name="grant_live")]

    def __str__(self) -> str:
        return f"grant #{self.pk}: {self.department.slug} calls {self.served_name}"

    @property
    def authors(self) -> set[int]:
        """Who may not decide this request (core.access.can_review): people, not accounts."""
        return {*self.author_ids, self.requested_by_id}


LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "tokens_per_month")


class DepartmentLimits(models.Model):
    """What one department's keys may use at the front doors, set by platform
    admins (serving/services/limits.py, audited). Empty: no limit of that kind.

    Requests per minute are counted by each front door (per deployment); tokens
    are metered across every door and enforced within one reconcile tick of
    being crossed (docs/door.md, "Limits")."""

    department = models.OneToOneField(Department, on_delete=models.CASCADE, related_name="limits")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    # Budgets: prompt plus completion tokens per UTC day and per UTC month.
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "department limits"
        constraints = [
            *(
                models.CheckConstraint(
                    condition=Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__gt": 0}),
                    name=f"department_{name}_positive",
                )
                for name in LIMIT_FIELDS
            ),
            # A day's budget above the month's could never be reached.
            models.CheckConstraint(
                condition=Q(tokens_per_day__isnull=True)
                | Q(tokens_per_month__isnull=True)
                | Q(tokens_per_day__lte=models.F("tokens_per_month")),
                name="department_day_budget_within_month",
            ),
        ]

    def __str__(self) -> str:
        return f"limits of {self.department.slug}"


class OwnProbe(models.Model):
    """A request the control plane itself sent through an adapter on a replica
    (verification, the weight check), recorded before it is sent and again
    once it answered. vLLM lists such a request in /metrics like a client's:
    observability does not count an adapter's label sets as clients' while it
    is marked here, and deletes the mark (compare-and-swap on probed_at) at
    the first read made SERVING_OWN_PROBE_GRACE_SECONDS after the last probe,
    whichever worker makes it (serving.records.own_probes)."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="own_probes")
    served_name = models.CharField(max_length=200)
    probed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["replica", "served_name"], name="own_probe_per_replica_adapter"
            )
        ]

    def __str__(self) -> str:
        return f"{self.served_name} probed at {self.probed_at}"


class DoorState(models.Model):
    """A deployment's desired door state (serving/door/state.py), which every
    door of the deployment pulls, and its generation: each change the control
    plane makes is a new generation, written compare-and-swap on it
    (serving/door/fleet.py). Deployments whose doors the workers drive
    through a local socket (SERVING_DOORS with a listen address) have none."""

    deployment = models.OneToOneField(
        Deployment, on_delete=models.CASCADE, related_name="door_state"
    )
    generation = models.BigIntegerField(default=0)
    document = models.JSONField(default=dict)
    changed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"door state of {self.deployment_id} at generation {self.generation}"


class DoorInstance(models.Model):
    """One door of a deployment as the control plane last heard of it: the
    generation it applied, when (its lease runs from `seen_at`), the requests
    still in flight on what it drained, its counters (what `samples` and
    `model_counters` read across doors), and where its peers reach it."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="doors")
    name = models.CharField(max_length=253)
    applied_generation = models.BigIntegerField(default=0)
    seen_at = models.DateTimeField()
    lease_seconds = models.FloatField()
    busy = models.IntegerField(default=0)
    report = models.JSONField(default=dict)
    # Where it talks HAProxy's peers protocol, when it finds its peers through
    # the control plane (DOOR_PEER_ADDRESS, docs/door.md#peers); else empty.
    peer_address = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "name"], name="door_name_per_deployment")
        ]

    def __str__(self) -> str:
        return f"door {self.name} of {self.deployment_id}"
