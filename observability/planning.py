"""From what a person or pipeline asks (API, page, `manage.py plan`) to a Plan:
a config.json, or a deployment's own configuration, plus overrides."""

from __future__ import annotations

from dataclasses import replace

from django.conf import settings

from observability.selectors import deployment_plan_input
from serving.models import Deployment
from serving.rules.planner import ModelShape, Plan, PlanInput, PlannerInputError, plan

OVERRIDES = (
    "gpu_type",
    "gpu_memory_bytes",
    "gpu_memory_utilization",
    "gpus_per_replica",
    "max_loras",
    "max_cpu_loras",
    "max_lora_rank",
    "context_length",
    "use_cases",
    "price_per_gpu_hour",
    "lora_memory_share",
    "observed_peak_adapters",
)


def plan_input_from(data: dict, deployment: Deployment | None = None) -> PlanInput:
    """`data`: validated PlannerInputSerializer data. Raises PlannerInputError."""
    overrides = {name: data[name] for name in OVERRIDES if data.get(name) is not None}
    overrides.setdefault("price_per_gpu_hour", settings.PLANNER_PRICE_PER_GPU_HOUR)
    if data.get("target_modules"):
        overrides["target_modules"] = tuple(data["target_modules"])
    if data.get("config") is not None:
        model = ModelShape.from_config(data["config"], dtype=data.get("dtype"))
        if deployment is not None:
            return replace(deployment_plan_input(deployment, **overrides), model=model)
        overrides.setdefault("gpu_memory_utilization", settings.PLANNER_GPU_MEMORY_UTILIZATION)
        overrides.setdefault("context_length", settings.PLANNER_CONTEXT_LENGTH)
        overrides.setdefault("use_cases", settings.PLANNER_USE_CASES)
        return PlanInput(model=model, **overrides)
    # PlannerInputSerializer asks for a config or a deployment.
    assert deployment is not None, "no config.json and no deployment"
    spec = deployment_plan_input(deployment, **overrides)
    if data.get("dtype"):
        spec = replace(spec, model=replace(spec.model, dtype=data["dtype"]))
    return spec


def form_defaults(deployment: Deployment | None = None) -> dict[str, str]:
    """What the planner page's inputs show before anyone types: the values the plan
    uses for a field left as it is (a deployment's own where it has them)."""
    defaults = {
        "gpu_memory_utilization": settings.PLANNER_GPU_MEMORY_UTILIZATION,
        "context_length": settings.PLANNER_CONTEXT_LENGTH,
        "use_cases": settings.PLANNER_USE_CASES,
        "price_per_gpu_hour": f"{settings.PLANNER_PRICE_PER_GPU_HOUR:.2f}",
    }
    if deployment is not None:
        try:
            spec = deployment_plan_input(deployment)
        except PlannerInputError:
            spec = None
        if spec is not None:
            defaults.update(
                max_loras=spec.max_loras,
                max_cpu_loras=spec.max_cpu_loras,
                use_cases=spec.use_cases,
            )
            if spec.gpu_memory_bytes:
                defaults["gpu_memory_bytes"] = spec.gpu_memory_bytes
    return {name: str(value) for name, value in defaults.items()}


def plan_for(data: dict, deployment: Deployment | None = None) -> Plan:
    return plan(plan_input_from(data, deployment))
