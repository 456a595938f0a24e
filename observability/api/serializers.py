from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from serving.rules.planner import DTYPE_BYTES, VALID_LORA_RANKS

GIB = 1024**3
# Memory of common data-centre GPUs, so a person can name the card instead of its bytes.
GPU_MEMORY = {
    "L40S": 48 * GIB,
    "L4": 24 * GIB,
    "A10G": 24 * GIB,
    "T4": 16 * GIB,
    "A100-40GB": 40 * GIB,
    "A100-80GB": 80 * GIB,
    "H100-80GB": 80 * GIB,
    "H200": 141 * GIB,
}


class PlannerInputSerializer(serializers.Serializer):
    """Either `config` (a base model's config.json) or `deployment` (filled from
    its configuration); any other field given overrides what the deployment says."""

    deployment = serializers.SlugField(required=False, help_text="Plan for this deployment.")
    # An object in the schema, as planning needs (a config.json is one).
    config = serializers.DictField(
        required=False,
        help_text="The base model's config.json (hidden_size, num_hidden_layers, …).",
    )
    dtype = serializers.ChoiceField(choices=sorted(DTYPE_BYTES), required=False)
    gpu_type = serializers.CharField(
        required=False,
        max_length=64,
        help_text=f"One of {', '.join(GPU_MEMORY)} sets gpu_memory_bytes.",
    )
    gpu_memory_bytes = serializers.IntegerField(required=False, min_value=1)
    gpu_memory_utilization = serializers.FloatField(required=False, min_value=0.01, max_value=1.0)
    gpus_per_replica = serializers.IntegerField(required=False, min_value=1, max_value=64)
    max_loras = serializers.IntegerField(required=False, min_value=1, max_value=1024)
    max_cpu_loras = serializers.IntegerField(required=False, min_value=1, max_value=100_000)
    max_lora_rank = serializers.ChoiceField(choices=list(VALID_LORA_RANKS), required=False)
    target_modules = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, max_length=64
    )
    context_length = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    use_cases = serializers.IntegerField(required=False, min_value=1, max_value=100_000)
    price_per_gpu_hour = serializers.FloatField(required=False, min_value=0)
    lora_memory_share = serializers.FloatField(required=False, min_value=0.001, max_value=0.999)
    observed_peak_adapters = serializers.IntegerField(required=False, min_value=0)

    def validate(self, attrs):
        if "deployment" not in attrs and "config" not in attrs:
            raise serializers.ValidationError(
                {"config": "Give a config.json, or name a deployment."}
            )
        if "config" in attrs and not isinstance(attrs["config"], dict):
            raise serializers.ValidationError({"config": "Must be a JSON object (a config.json)."})
        gpu = attrs.get("gpu_type")
        if gpu and "gpu_memory_bytes" not in attrs:
            if gpu not in GPU_MEMORY:
                raise serializers.ValidationError(
                    {
                        "gpu_type": f"Unknown GPU {gpu!r}: give gpu_memory_bytes, "
                        f"or one of {', '.join(GPU_MEMORY)}."
                    }
                )
            attrs["gpu_memory_bytes"] = GPU_MEMORY[gpu]
        if "deployment" not in attrs and "gpu_memory_bytes" not in attrs:
            raise serializers.ValidationError(
                {"gpu_memory_bytes": "Give gpu_memory_bytes or a known gpu_type."}
            )
        return attrs


class EconomicsSerializer(serializers.Serializer):
    use_cases = serializers.IntegerField()
    dedicated_gpus = serializers.IntegerField()
    dedicated_vram_bytes = serializers.IntegerField()
    dedicated_cost_per_month = serializers.FloatField()
    shared_gpus = serializers.IntegerField()
    shared_vram_bytes = serializers.IntegerField()
    shared_cost_per_month = serializers.FloatField()
    saving_per_month = serializers.FloatField()
    fits_cpu_cache = serializers.BooleanField()


class PlanSerializer(serializers.Serializer):
    gpu_type = serializers.CharField()
    vram_bytes = serializers.IntegerField(help_text="GPU memory of one replica.")
    usable_bytes = serializers.IntegerField(help_text="vram_bytes x gpu_memory_utilization.")
    base_weights_bytes = serializers.IntegerField()
    parameters = serializers.IntegerField()
    lora_slot_bytes = serializers.IntegerField(help_text="One max_loras slot at max_lora_rank.")
    lora_pool_bytes = serializers.IntegerField(help_text="What vLLM preallocates: max_loras slots.")
    cpu_cache_bytes = serializers.IntegerField(
        help_text="max_cpu_loras adapters at max_lora_rank in host memory."
    )
    reserve_bytes = serializers.IntegerField(help_text="Activations and runtime (estimated).")
    kv_cache_bytes = serializers.IntegerField()
    kv_bytes_per_token = serializers.IntegerField()
    kv_cache_tokens = serializers.IntegerField()
    concurrent_sequences = serializers.IntegerField(
        help_text="Sequences of context_length the KV cache holds."
    )
    lora_share = serializers.FloatField(help_text="LoRA pool / VRAM.")
    lora_share_verdict = serializers.ChoiceField(
        choices=["below", "within", "above"], help_text="Against the 10-15% advice."
    )
    kv_share = serializers.FloatField()
    max_loras_within_share = serializers.IntegerField()
    max_loras_recommended = serializers.IntegerField()
    recommendation = serializers.CharField()
    economics = EconomicsSerializer()
    fits = serializers.BooleanField()
    warnings = serializers.ListField(child=serializers.CharField())


class _ErrorBody(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField(
        help_text='For 400: {"fields": {field: [why]}} naming each bad field.'
    )
    request_id = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    """The one error shape every endpoint answers with (core.api.errors)."""

    error = _ErrorBody()


MAX_USAGE_DAYS = 366


class UsageQuerySerializer(serializers.Serializer):
    """?department=&from=&to= (dates in UTC, both included; the last 30 days by default)."""

    department = serializers.SlugField(
        required=False, help_text="A department's slug; every department you see by default."
    )
    # `from` is a Python keyword: the field is renamed in to_internal_value.
    start = serializers.DateField(required=False, help_text="First day (YYYY-MM-DD).")
    end = serializers.DateField(
        required=False, help_text="Last day (YYYY-MM-DD), today by default."
    )

    def to_internal_value(self, data):
        data = {
            "department": data.get("department") or None,
            "start": data.get("from") or None,
            "end": data.get("to") or None,
        }
        try:
            values = super().to_internal_value({k: v for k, v in data.items() if v is not None})
        except serializers.ValidationError as error:  # named as the caller spelt them
            names = {"start": "from", "end": "to"}
            raise serializers.ValidationError(
                {names.get(k, k): v for k, v in error.detail.items()}
            ) from None
        end = values.get("end") or timezone.now().date()
        start = values.get("start") or end - timedelta(days=29)
        if start > end:
            raise serializers.ValidationError({"from": ["Must not be after `to`."]})
        if (end - start).days + 1 > MAX_USAGE_DAYS:
            raise serializers.ValidationError(
                {"from": [f"At most {MAX_USAGE_DAYS} days from `from` to `to`."]}
            )
        return {"department": values.get("department"), "start": start, "end": end}


class UsageRowSerializer(serializers.Serializer):
    """Requests to one department's adapter counted at a front door (errors included)."""

    day = serializers.DateField()
    deployment = serializers.CharField(source="deployment.name")
    department = serializers.CharField(source="department.slug", help_text="The adapter's.")
    adapter = serializers.IntegerField(source="adapter_id")
    served_name = serializers.CharField()
    version = serializers.IntegerField(source="version_id", allow_null=True)
    version_number = serializers.IntegerField(help_text="0: no version was served (retired).")
    requests = serializers.IntegerField()
    errors_4xx = serializers.IntegerField()
    errors_5xx = serializers.IntegerField()


class CallRowSerializer(serializers.Serializer):
    """Requests and tokens vLLM served on one day for one calling key and
    adapter version (its own counts, streams included)."""

    day = serializers.DateField()
    deployment = serializers.CharField(source="deployment.name")
    calling_department = serializers.CharField(
        source="department.slug",
        allow_null=True,
        default=None,
        help_text="Who called, and is charged: the key's department. Null: no key (an open "
        "door, or a request sent to a replica directly).",
    )
    key = serializers.IntegerField(source="key_id", allow_null=True, help_text="The key's id.")
    owning_department = serializers.CharField(
        source="owner.slug",
        allow_null=True,
        default=None,
        help_text="Whose adapter was called; null for the base model.",
    )
    adapter = serializers.IntegerField(source="adapter_id", allow_null=True)
    served_name = serializers.CharField()
    version = serializers.IntegerField(source="version_id", allow_null=True)
    version_number = serializers.IntegerField(help_text="0: the base model.")
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    tokens = serializers.IntegerField(help_text="prompt_tokens + completion_tokens.")


class DepartmentCostSerializer(serializers.Serializer):
    department = serializers.CharField(source="department.slug")
    requests = serializers.IntegerField(help_text="To its adapters, counted at the front doors.")
    called_requests = serializers.IntegerField(help_text="What its keys called (vLLM's count).")
    prompt_tokens = serializers.IntegerField(help_text="What its keys called.")
    completion_tokens = serializers.IntegerField(help_text="What its keys called.")
    use_cases = serializers.IntegerField(help_text="Its adapters with requests in the period.")
    shared_monthly_cost = serializers.FloatField(
        source="shared_monthly",
        allow_null=True,
        help_text="Its share of each deployment's monthly GPU cost: by the weighted tokens its "
        "keys called there (by requests to its adapters where replicas report no tokens); "
        "platform admins only (null for others: with their own counts it would give other "
        "departments' totals).",
    )
    cost_share = serializers.CharField(
        source="share_band",
        help_text="Its part of the monthly GPU cost of the deployments it used, as a quarter "
        '("25–50%"); empty without cost.',
    )
    dedicated_monthly_cost = serializers.FloatField(
        source="dedicated_monthly", help_text="One dedicated one-GPU deployment per use case."
    )
    monthly_saving = serializers.FloatField(
        source="saving_monthly", allow_null=True, help_text="Platform admins only, as above."
    )


class UnattributedRowSerializer(serializers.Serializer):
    """Tokens a deployment's replicas counted on one day that no span reported:
    requests vLLM did not finish (aborted streams), charged to no department."""

    day = serializers.DateField()
    deployment = serializers.CharField(source="deployment.name")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class UsageSerializer(serializers.Serializer):
    start = serializers.DateField(help_text="`from`, as applied.")
    end = serializers.DateField(help_text="`to`, as applied.")
    price_per_gpu_hour = serializers.FloatField()
    hours_per_month = serializers.IntegerField()
    prompt_token_weight = serializers.FloatField(
        help_text="What a prompt token counts in the cost split (SERVING_COST_PROMPT_TOKEN_WEIGHT)."
    )
    completion_token_weight = serializers.FloatField(
        help_text="What a completion token counts (SERVING_COST_COMPLETION_TOKEN_WEIGHT)."
    )
    rows = UsageRowSerializer(many=True)
    calls = CallRowSerializer(
        many=True, help_text="By who called and whose adapter: the rows the CSV exports."
    )
    costs = DepartmentCostSerializer(many=True)
    unattributed = UnattributedRowSerializer(
        many=True,
        help_text="A platform admin's only: per deployment and day, tokens vLLM counted "
        "that no span reported (aborted streams), charged to no department.",
    )
