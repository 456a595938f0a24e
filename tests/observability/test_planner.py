"""The planner's arithmetic, checked against vLLM's allocation shapes written
out by hand (vllm/lora/layers/*.create_lora_weights, 0.32), and against the
product document's example (10 adapters of an 8B model on L40S)."""

from math import prod

import pytest

from serving.rules.planner import (
    ModelShape,
    PlanInput,
    PlannerInputError,
    lora_pool_bytes,
    lora_slot_bytes,
    plan,
)

TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "torch_dtype": "float32",
}
LLAMA_3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}
GIB = 1024**3


def vllm_buffers(m: int, r: int) -> list[tuple[int, ...]]:
    """Every tensor vLLM 0.32 allocates for the tiny Llama's LoRA pool."""
    per_layer = [
        *[(m, 1, r, 128)] * 3,  # qkv_proj: one A per slice
        (m, 1, 128, r), (m, 1, 128, r), (m, 1, 128, r),  # q, k, v B
        (m, 1, r, 128), (m, 1, 128, r),  # o_proj
        (m, 1, r, 128), (m, 1, r, 128), (m, 1, 256, r), (m, 1, 256, r),  # gate_up_proj
        (m, 1, r, 256), (m, 1, 128, r),  # down_proj
    ]  # fmt: skip
    embedding = [(m, 512, r), (m, 1, 128, r)]
    logits = [(m, 1, r, 128), (m, 1, 512, r)]
    return per_layer * 2 + embedding + logits


@pytest.mark.parametrize(("max_loras", "rank"), [(1, 16), (8, 16), (1, 64), (8, 64)])
def test_the_pool_is_every_buffer_vllm_allocates(max_loras, rank):
    model = ModelShape.from_config(TINY)
    expected = sum(prod(shape) for shape in vllm_buffers(max_loras, rank)) * 4
    assert lora_pool_bytes(model, max_loras, rank) == expected


def test_the_pool_follows_the_lora_dtype():
    model = ModelShape.from_config(TINY)
    assert lora_slot_bytes(model, 16, "float16") * 2 == lora_slot_bytes(model, 16, "float32")


def test_an_8b_model_on_l40s_matches_the_documents_table():
    spec = PlanInput(
        model=ModelShape.from_config(LLAMA_3_8B),
        gpu_type="L40S",
        gpu_memory_bytes=48 * GIB,
        max_loras=4,
        max_cpu_loras=16,
        max_lora_rank=16,
        context_length=8192,
        use_cases=10,
        price_per_gpu_hour=1.0,
    )
    result = plan(spec)
    assert abs(result.parameters - 8.03e9) < 0.01e9
    assert result.base_weights_bytes == result.parameters * 2
    # 10 dedicated pods of one L40S each (480 GB), against one shared L40S.
    economics = result.economics
    assert (economics.dedicated_gpus, economics.shared_gpus) == (10, 1)
    assert economics.dedicated_vram_bytes == 480 * GIB
    assert economics.dedicated_cost_per_month == 7300.0
    assert economics.saving_per_month == 6570.0
    # KV: 2 x 32 layers x 8 kv heads x 128 x 2 bytes per token.
    assert result.kv_bytes_per_token == 131072
    left = int(48 * GIB * 0.9) - result.base_weights_bytes - result.lora_pool_bytes
    assert result.kv_cache_bytes == left - result.reserve_bytes
    assert result.kv_cache_tokens == result.kv_cache_bytes // 131072
    assert result.concurrent_sequences == result.kv_cache_tokens // 8192
    # Four rank-16 slots are well under 1% of the card: below the advised 10-15%.
    assert result.lora_share < 0.01 and result.lora_share_verdict == "below"
    assert result.fits


def test_more_use_cases_than_the_cpu_cache_is_a_warning():
    spec = PlanInput(
        model=ModelShape.from_config(LLAMA_3_8B),
        gpu_memory_bytes=48 * GIB,
        max_loras=2,
        max_cpu_loras=4,
        use_cases=10,
    )
    result = plan(spec)
    assert not result.economics.fits_cpu_cache
    assert any("max_cpu_loras 4" in w for w in result.warnings)


def test_a_model_too_big_for_the_gpu_does_not_fit():
    result = plan(PlanInput(model=ModelShape.from_config(LLAMA_3_8B), gpu_memory_bytes=16 * GIB))
    assert not result.fits and result.kv_cache_bytes == 0
    assert "do not fit" in result.warnings[0]


def test_max_loras_follows_observed_concurrency_within_the_share():
    model = ModelShape.from_config(LLAMA_3_8B)
    base = PlanInput(model=model, gpu_memory_bytes=48 * GIB, max_loras=8, max_cpu_loras=16)
    assert plan(base).max_loras_recommended == 8  # nothing observed: keep
    quiet = PlanInput(**{**base.__dict__, "observed_peak_adapters": 3})
    assert plan(quiet).max_loras_recommended == 3
    busy = PlanInput(**{**base.__dict__, "observed_peak_adapters": 8, "observed_waiting": True})
    assert plan(busy).max_loras_recommended == 16
    tight = PlanInput(**{**busy.__dict__, "lora_memory_share": 0.01})
    result = plan(tight)
    assert result.max_loras_recommended == result.max_loras_within_share == 5


def test_config_errors_name_the_field():
    with pytest.raises(PlannerInputError) as error:
        ModelShape.from_config({"hidden_size": -1, "vocab_size": 10})
    assert {"config.hidden_size", "config.num_hidden_layers"} <= set(error.value.fields)


def test_input_errors_name_the_field():
    model = ModelShape.from_config(TINY)
    spec = PlanInput(
        model=model, gpu_memory_bytes=GIB, max_loras=8, max_cpu_loras=4, max_lora_rank=48,
        target_modules=("q_proj", "lm_bias"),
    )  # fmt: skip
    with pytest.raises(PlannerInputError) as error:
        plan(spec)
    assert set(error.value.fields) == {"max_cpu_loras", "max_lora_rank", "target_modules"}
    assert "lm_bias" in error.value.fields["target_modules"]
