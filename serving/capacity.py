"""A deployment's LoRA pool (what vLLM preallocates for max_loras slots at
max_lora_rank, serving.planner) against its share of GPU memory."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from serving.models import Deployment
from serving.planner import ModelShape, lora_pool_bytes, lora_slot_bytes

# Fields of Deployment the pool model needs.
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def deployment_shape(deployment: Deployment) -> ModelShape | None:
    """The base model as the deployment describes it; None when a dimension is unknown."""
    values = {name: getattr(deployment, name) for name in SHAPE_FIELDS}
    if not all(values.values()):
        return None
    modules = {
        name: (int(dims[0]), int(dims[1]))
        for name, dims in (deployment.module_dims or {}).items()
        if isinstance(dims, list | tuple) and len(dims) == 2
    }
    return ModelShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_layers=values["num_layers"],
        num_attention_heads=values["num_attention_heads"],
        num_key_value_heads=values["num_key_value_heads"],
        vocab_size=values["vocab_size"],
        dtype=settings.SERVING_DTYPE,
        modules=modules,
    )


@dataclass(frozen=True)
class PoolFigures:
    pool_bytes: int | None
    slot_bytes: int | None
    budget_bytes: int | None

    @property
    def over(self) -> bool:
        return (
            None not in (self.pool_bytes, self.budget_bytes) and self.pool_bytes > self.budget_bytes
        )


def pool_figures(
    deployment: Deployment, *, max_loras: int | None = None, max_lora_rank: int | None = None
) -> PoolFigures:
    shape = deployment_shape(deployment)
    budget = (
        int(deployment.gpu_memory_bytes * deployment.lora_memory_share)
        if deployment.gpu_memory_bytes
        else None
    )
    if shape is None:
        return PoolFigures(None, None, budget)
    rank = max_lora_rank or deployment.max_lora_rank
    return PoolFigures(
        pool_bytes=lora_pool_bytes(shape, max_loras or deployment.max_loras, rank),
        slot_bytes=lora_slot_bytes(shape, rank),
        budget_bytes=budget,
    )
