from __future__ import annotations

from django.conf import settings
from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils.field_mapping import get_field_kwargs

from serving.attestation import quarantine_reason
from serving.capacity import Tiers, deployment_tiers
from serving.fact_readings import disputes as fact_disputes
from serving.models import (
    Adoption,
    Canary,
    CanaryOutcome,
    CanaryRequest,
    Deployment,
    DriftEvent,
    HttpAttempt,
    Promotion,
    Replica,
    ReplicaHealth,
    ReplicaRollout,
    Rollout,
)
from serving.selectors import canary_split, rollout_replica_summary
from serving.services.deployments import IDENTITY_FIELDS


class ReplicaSerializer(serializers.ModelSerializer):
    class Meta:
        model = Replica
        fields = [
            "id",
            "base_url",
            "discovered_via",
            "active",
            "health",
            "vllm_version",
            "last_seen_at",
            "last_checked_at",
            "last_error",
            "in_sync_polls",
            "in_sync_since",
            "reported_facts",
        ]


class FactDisputeSerializer(serializers.Serializer):
    replica = serializers.CharField()
    fact = serializers.CharField(help_text="base model, base model path or max_loras.")
    recorded = serializers.JSONField(help_text="What the deployment record says.")
    reported = serializers.JSONField(help_text="What the replica reports.")
    fix = serializers.CharField()
    message = serializers.CharField()


class TierUseSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    used = serializers.IntegerField(
        allow_null=True, help_text="Null where vLLM does not say (not observed yet)."
    )
    how = serializers.CharField(help_text="How `used` is known.")


class ColdLoadSerializer(serializers.Serializer):
    samples = serializers.IntegerField(
        help_text="Successful loads on the replicas it is predicted from; 0 means none yet."
    )
    median_ms = serializers.FloatField(allow_null=True)
    p95_ms = serializers.FloatField(allow_null=True)
    message = serializers.CharField()


class TiersSerializer(serializers.Serializer):
    """vLLM's three tiers on the deployment, over every department's adapters."""

    batch = TierUseSerializer(help_text="max_loras: adapters in one batch, buffers on the GPU.")
    host = TierUseSerializer(help_text="max_cpu_loras: adapters cached in host memory (LRU).")
    registered = TierUseSerializer(
        help_text="max_registered_adapters: every adapter promoted here; an evicted one is "
        "re-read from its lora_path on its next request."
    )
    evicting = serializers.BooleanField(help_text="More registered than the host cache holds.")
    cold_load = ColdLoadSerializer()


def tiers_data(tiers: Tiers) -> dict:
    def use(tier):
        return {"limit": tier.limit, "used": tier.used, "how": tier.how}

    cold = tiers.cold_load
    return {
        "batch": use(tiers.batch),
        "host": use(tiers.host),
        "registered": use(tiers.registered),
        "evicting": tiers.evicting,
        "cold_load": {
            "samples": cold.samples,
            "median_ms": cold.median_ms,
            "p95_ms": cold.p95_ms,
            "message": cold.describe(),
        },
    }


class TiersMixin(serializers.Serializer):
    """`tiers`, from the context's {deployment id: Tiers} when the view computed
    them for a whole page at once, else for this deployment alone."""

    tiers = serializers.SerializerMethodField()

    @extend_schema_field(TiersSerializer)
    def get_tiers(self, deployment) -> dict:
        known = self.context.get("tiers") or {}
        tiers = known.get(deployment.pk) or deployment_tiers(deployment)
        return tiers_data(tiers)


class DepartmentSlugsField(serializers.ListField):
    child = serializers.SlugField()

    def to_representation(self, departments):
        return [department.slug for department in departments.all()]


class DeploymentSerializer(TiersMixin, serializers.ModelSerializer):
    replicas = ReplicaSerializer(many=True, read_only=True)
    # Slugs, resolved by the view: one that names no department is a 404, like
    # every other name a request refers to (a 400 here would be a schema-valid
    # request refused for a reason the schema cannot state).
    allowed_departments = DepartmentSlugsField(required=False)
    vllm_api_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, style={"input_type": "password"}
    )
    has_api_key = serializers.SerializerMethodField()
    fact_disputes = serializers.SerializerMethodField(
        help_text="Where a replica reports other facts than this record (drift): promotions "
        "are refused with 409 replica_facts_disputed until the record or the replica is fixed."
    )
    base_model_path = serializers.CharField(
        write_only=True,
        required=False,
        help_text="A folder with the base model's config.json; fills the identity fields.",
    )
    restore_hold = serializers.SerializerMethodField(
        help_text="Why nothing is sent to this deployment's replicas after a restore (its "
        "rows differ from the audit chain) until a platform admin acknowledges it; null when "
        "it serves."
    )

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "environment",
            "description",
            "base_model_name",
            "base_model_aliases",
            "base_model_path",
            *IDENTITY_FIELDS,
            "revision",
            "module_dims",
            "replica_urls",
            "replica_dns_name",
            "replica_port",
            "replica_scheme",
            "kubernetes_namespace",
            "kubernetes_label_selector",
            "kubernetes_service_name",
            "vllm_api_key",
            "has_api_key",
            "max_loras",
            "max_cpu_loras",
            "placement_capacity",
            "max_lora_rank",
            "max_registered_adapters",
            "gpu_memory_bytes",
            "lora_memory_share",
            "volume_write_path",
            "volume_serve_path",
            "runtime_image",
            "base_model_pvc",
            "adapter_pvc",
            "gpu_memory_utilization",
            "gpus",
            "max_model_len",
            "runtime_resources",
            "requires_promotion_approval",
            "allowed_departments",
            "unload_unknown_adapters",
            "canary_by_default",
            "verify_with_completion",
            "require_all_replicas",
            "open_door",
            "last_reconciled_at",
            "replicas",
            "fact_disputes",
            "restore_hold",
            "tiers",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["last_reconciled_at", "created_at", "updated_at"]
        # The model's CheckConstraint, in the schema and answered as a 400 naming the field.
        extra_kwargs = {
            "max_registered_adapters": {"min_value": 1},
            "placement_capacity": {
                "min_value": 1,
                "help_text": "Adapters with placement bounds one replica holds at most; "
                "null: max_cpu_loras.",
            },
        }

    def get_has_api_key(self, deployment) -> bool:
        return bool(deployment.vllm_api_key)

    def get_restore_hold(self, deployment) -> str | None:
        return quarantine_reason(deployment) or None

    @extend_schema_field(FactDisputeSerializer(many=True))
    def get_fact_disputes(self, deployment) -> list[dict]:
        active = [r for r in deployment.replicas.all() if r.active]
        return [
            {**dispute.__dict__, "message": dispute.message}
            for dispute in fact_disputes(deployment, active)
        ]


class DeploymentSummarySerializer(TiersMixin, serializers.ModelSerializer):
    """What members and tokens see of a deployment they may use: what it serves
    and under which limits and policy, not where its replicas and volume are."""

    allowed_departments = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)
    replicas_total = serializers.SerializerMethodField()
    replicas_up = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "environment",
            "description",
            "base_model_name",
            "base_model_aliases",
            *IDENTITY_FIELDS,
            "revision",
            "module_dims",
            "max_loras",
            "max_cpu_loras",
            "placement_capacity",
            "max_lora_rank",
            "max_registered_adapters",
            "gpu_memory_bytes",
            "lora_memory_share",
            "requires_promotion_approval",
            "allowed_departments",
            "canary_by_default",
            "open_door",
            "last_reconciled_at",
            "replicas_total",
            "replicas_up",
            "tiers",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_replicas_total(self, deployment) -> int:
        return sum(1 for r in deployment.replicas.all() if r.active)

    def get_replicas_up(self, deployment) -> int:
        return sum(1 for r in deployment.replicas.all() if r.active and r.health == "up")


class HasCanaryField(serializers.BooleanField):
    """Whether the promotion or rollout has a canary (its Canary row); the
    API's `canary` flag, as it was when it was a column."""

    def get_attribute(self, instance) -> bool:
        return getattr(instance, "canary", None) is not None


# The canary's share and bake time under the names the API has always had;
# null without a canary or without a split. Bounded as a ModelSerializer bounds
# the model's field (the database's integer range), as when they were columns.
def _canary_number(name: str) -> serializers.IntegerField:
    field = Canary._meta.get_field(name)
    assert isinstance(field, models.Field), name
    bounds = get_field_kwargs(name, field)
    return serializers.IntegerField(
        source=f"canary.{name}",
        required=False,
        allow_null=True,
        min_value=bounds.get("min_value"),
        max_value=bounds.get("max_value"),
    )


class PromotionSerializer(serializers.ModelSerializer):
    canary = HasCanaryField(required=False)
    canary_share = _canary_number("share")
    canary_bake_seconds = _canary_number("bake_seconds")
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    reviewed_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    adapter = serializers.IntegerField(source="version.adapter_id", read_only=True)
    version_number = serializers.IntegerField(source="version.number", read_only=True)
    rollout = serializers.SerializerMethodField()

    class Meta:
        model = Promotion
        fields = [
            "id",
            "deployment",
            "version",
            "adapter",
            "version_number",
            "status",
            "canary",
            "canary_share",
            "canary_bake_seconds",
            "gate_report",
            "requested_by",
            "reviewed_by",
            "reviewed_at",
            "comment",
            "created_at",
            "rollout",
        ]

    def get_rollout(self, promotion) -> int | None:
        rollout = promotion.rollouts.order_by("-id").first()
        return rollout.pk if rollout else None


class TrafficCanarySerializer(serializers.Serializer):
    share = serializers.IntegerField(
        min_value=1, max_value=50, help_text="Percent of the adapter's requests."
    )
    bake_seconds = serializers.IntegerField(
        min_value=1,
        # The setting's value when the schema is made (SERVING_CANARY_MAX_BAKE_SECONDS).
        max_value=settings.SERVING_CANARY_MAX_BAKE_SECONDS,
        help_text="How long the canary bakes before its gates decide "
        "(at most SERVING_CANARY_MAX_BAKE_SECONDS).",
    )


class PromotionCreateSerializer(serializers.Serializer):
    deployment = serializers.SlugField()
    version = serializers.IntegerField()
    canary = serializers.BooleanField(required=False, allow_null=True, default=None)
    traffic_canary = TrafficCanarySerializer(
        required=False,
        allow_null=True,
        default=None,
        help_text="A traffic canary: the new version takes `share` percent of the "
        "adapter's requests at the front door for `bake_seconds`, then every replica "
        "if its health gates hold, else it is rolled back. Needs a front door, a "
        "version served already and two replicas (409 canary_not_possible).",
    )


class ReviewSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="")


class HttpAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = HttpAttempt
        fields = [
            "purpose",
            "method",
            "url",
            "started_at",
            "duration_ms",
            "status_code",
            "ok",
            "transient",
            "error",
        ]


class ReplicaRolloutSerializer(serializers.ModelSerializer):
    base_url = serializers.CharField(source="replica.base_url")
    attempts = HttpAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = ReplicaRollout
        fields = ["base_url", "status", "error", "updated_at", "attempts"]


class ReplicaSummarySerializer(serializers.Serializer):
    total = serializers.IntegerField()
    done = serializers.IntegerField(help_text="Replicas that serve the version (or unloaded it).")
    deferred = serializers.IntegerField(
        help_text="Down when the rollout started: the reconcile loads and verifies the "
        "version when they are back."
    )
    text = serializers.CharField(help_text='e.g. "3 of 4 replicas serve v2, 1 deferred (down)"')


class CanarySideSerializer(serializers.Serializer):
    requests = serializers.IntegerField(help_text="Since the bake began.")
    # DRF's metaclass takes declared fields off the class: no shadowing of .errors.
    errors = serializers.IntegerField(  # type: ignore[assignment]
        help_text="5xx answers and failed connections or responses at the front door."
    )
    error_rate = serializers.FloatField()
    latency_ms = serializers.FloatField(
        allow_null=True, help_text="Mean response time of the last 1024 requests (HAProxy)."
    )


class CanaryGateSerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=["errors", "latency"])
    verdict = serializers.ChoiceField(choices=["pass", "fail", "wait"])
    canary = serializers.FloatField(allow_null=True)
    baseline = serializers.FloatField(allow_null=True)
    limit = serializers.FloatField(allow_null=True)
    message = serializers.CharField()


class CanaryRollbackSerializer(serializers.Serializer):
    switch_ms = serializers.FloatField(
        help_text="The traffic switch: weight 0 on the canary at the front door."
    )
    drained_ms = serializers.FloatField(help_text="Until its requests in flight were done.")
    restored_ms = serializers.FloatField(
        required=False,
        help_text="Until the old version served again on the canary replica: what a "
        "rollback by reload would have taken before traffic was safe.",
    )


class CanarySplitSerializer(serializers.Serializer):
    """A traffic canary as it bakes, or as it was decided."""

    share = serializers.IntegerField(help_text="Percent of the adapter's requests.")
    bake_seconds = serializers.IntegerField()
    bake_until = serializers.DateTimeField(allow_null=True)
    seconds_left = serializers.IntegerField(allow_null=True)
    replica = serializers.CharField(allow_null=True, help_text="The canary replica's URL.")
    weights = serializers.DictField(child=serializers.IntegerField())
    outcome = serializers.ChoiceField(choices=CanaryOutcome.choices, allow_blank=True)
    requested = serializers.ChoiceField(
        choices=CanaryRequest.choices,
        allow_blank=True,
        help_text="promote or abort, asked by a person and not acted on yet.",
    )
    verdict = serializers.ChoiceField(choices=["pass", "fail", "wait"], allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    canary = CanarySideSerializer(allow_null=True)
    baseline = CanarySideSerializer(allow_null=True)
    gates = CanaryGateSerializer(many=True)
    checked_at = serializers.DateTimeField(allow_null=True)
    rollback = CanaryRollbackSerializer(allow_null=True)


class RolloutSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cancelled_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    replicas_summary = serializers.SerializerMethodField()
    served_name = serializers.CharField(source="adapter.served_name", read_only=True)
    target_version_number = serializers.IntegerField(
        source="target_version.number", read_only=True, allow_null=True
    )
    previous_version_number = serializers.IntegerField(
        source="previous_version.number", read_only=True, allow_null=True
    )
    replicas = ReplicaRolloutSerializer(source="replica_steps", many=True, read_only=True)
    canary = HasCanaryField(required=False)
    canary_share = _canary_number("share")
    canary_bake_seconds = _canary_number("bake_seconds")
    canary_split = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = [
            "id",
            "deployment",
            "adapter",
            "served_name",
            "kind",
            "status",
            "target_version",
            "target_version_number",
            "previous_version",
            "previous_version_number",
            "canary",
            "canary_share",
            "canary_bake_seconds",
            "canary_split",
            "staged_path",
            "served_path",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "cancelled_by",
            "replicas_summary",
            "replicas",
        ]

    @extend_schema_field(CanarySplitSerializer(allow_null=True))
    def get_canary_split(self, rollout) -> dict | None:
        return canary_split(rollout)

    @extend_schema_field(ReplicaSummarySerializer)
    def get_replicas_summary(self, rollout) -> dict:
        return rollout_replica_summary(rollout)


class RollbackSerializer(serializers.Serializer):
    adapter = serializers.IntegerField()
    version = serializers.IntegerField(required=False, help_text="Default: the previous version.")


class CancelSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class RetireSerializer(serializers.Serializer):
    adapter = serializers.IntegerField()


class DriftEventSerializer(serializers.ModelSerializer):
    replica = serializers.CharField(source="replica.base_url")

    class Meta:
        model = DriftEvent
        fields = [
            "id",
            "replica",
            "kind",
            "adapter_name",
            "expected_root",
            "actual_root",
            "detail",
            "created_at",
            "count",
            "last_seen_at",
        ]


class DriftEventSummarySerializer(serializers.ModelSerializer):
    """Drift as members see it: which of their adapters, not which host or path."""

    class Meta:
        model = DriftEvent
        fields = ["id", "kind", "adapter_name", "created_at", "count", "last_seen_at"]


class StraySerializer(serializers.Serializer):
    served_name = serializers.CharField()
    roots = serializers.ListField(child=serializers.CharField())
    replicas = serializers.ListField(child=serializers.CharField())


class AdoptRequestSerializer(serializers.Serializer):
    served_name = serializers.CharField(max_length=128, help_text="The name vLLM serves it as.")
    department = serializers.SlugField(help_text="The department that will own it.")
    adapter = serializers.SlugField(
        max_length=100, help_text="The adapter's name in that department (created if new)."
    )


class AdoptionSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    department = serializers.CharField(source="adapter.department.slug", read_only=True)
    adapter = serializers.CharField(source="adapter.name", read_only=True)
    version = serializers.IntegerField(source="version_id", read_only=True)
    version_number = serializers.IntegerField(source="version.number", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Adoption
        fields = [
            "id",
            "deployment",
            "served_name",
            "lora_path",
            "department",
            "adapter",
            "version",
            "version_number",
            "status",
            "requested_by",
            "created_at",
            "finished_at",
        ]


class PlacedReplicaSerializer(serializers.Serializer):
    # DRF's metaclass takes declared fields off the class: no shadowing of .label.
    label = serializers.CharField(  # type: ignore[assignment]
        help_text="replica-1, replica-2, ... in address order."
    )
    health = serializers.ChoiceField(choices=ReplicaHealth.choices)
    base_url = serializers.CharField(
        required=False, help_text="Platform admins only: the replica's address."
    )


class PlacementSerializer(serializers.Serializer):
    """Where one adapter lives on the deployment, and why (serving.rules.placement_plan)."""

    served_name = serializers.CharField()
    department = serializers.SlugField()
    version = serializers.IntegerField(allow_null=True, help_text="Null: not served yet.")
    min_replicas = serializers.IntegerField(allow_null=True)
    max_replicas = serializers.IntegerField(allow_null=True)
    wanted = serializers.IntegerField(help_text="How many replicas placement wants it on.")
    replicas = PlacedReplicaSerializer(many=True)
    reason = serializers.ChoiceField(
        choices=["everywhere", "demand", "min", "max", "no_room", "held", "pending"]
    )
    reason_text = serializers.CharField()
    detail = serializers.CharField(allow_blank=True)
    demand = serializers.FloatField(
        allow_null=True,
        help_text="Smoothed requests running and waiting (null: no bounds, not tracked).",
    )


class PlacementBoundsSerializer(serializers.Serializer):
    adapter = serializers.IntegerField(help_text="The adapter's id.")
    min_replicas = serializers.IntegerField(
        allow_null=True, min_value=1, max_value=1024, help_text="Null: the max."
    )
    max_replicas = serializers.IntegerField(
        allow_null=True, min_value=1, max_value=1024, help_text="Null: every replica."
    )

    def validate(self, attrs):
        low, high = attrs.get("min_replicas"), attrs.get("max_replicas")
        if None not in (low, high) and low > high:
            raise serializers.ValidationError(
                {"min_replicas": f"must not be above max_replicas ({high})"}
            )
        return attrs
