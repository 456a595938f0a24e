"""Shapes derived from a base model's config.json, for every architecture the
conformance tier serves (tests/conformance proves them against real vLLM)."""

from __future__ import annotations

import pytest

from serving.rules.base_models import PACKED_MODULES, identity_from_config

SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 512,
}
SEPARATE = {
    "q_proj": [128, 128],
    "k_proj": [128, 64],
    "v_proj": [128, 64],
    "o_proj": [128, 128],
    "gate_proj": [128, 256],
    "up_proj": [128, 256],
    "down_proj": [256, 128],
}
EMBEDDINGS = {"embed_tokens": [512, 128], "lm_head": [128, 512]}


@pytest.mark.parametrize(
    ("architecture", "expected"),
    [
        ("LlamaForCausalLM", SEPARATE | EMBEDDINGS),
        ("Qwen3ForCausalLM", SEPARATE | EMBEDDINGS),
        ("GraniteForCausalLM", SEPARATE | EMBEDDINGS),
        # vLLM declares no embedding LoRA for these (embedding_modules empty or absent).
        ("Qwen2ForCausalLM", SEPARATE),
        ("MistralForCausalLM", SEPARATE),
        ("Gemma2ForCausalLM", SEPARATE),
        ("Gemma3ForCausalLM", SEPARATE),
    ],
)
def test_separate_projections_are_sized_from_the_config(architecture, expected):
    identity = identity_from_config({"architectures": [architecture], **SHAPE, "head_dim": 64})
    assert identity["module_dims"] == expected


def test_phi3_targets_its_fused_projections():
    identity = identity_from_config({"architectures": ["Phi3ForCausalLM"], **SHAPE})
    assert (
        identity["module_dims"]
        == {
            "qkv_proj": [128, 128 + 2 * 64],
            "o_proj": [128, 128],
            "gate_up_proj": [128, 512],
            "down_proj": [256, 128],
        }
        | EMBEDDINGS
    )
    # As vLLM 0.32 maps them: the fused names are their own packed slices.
    assert PACKED_MODULES["Phi3ForCausalLM"] == {
        "qkv_proj": ["qkv_proj"],
        "gate_up_proj": ["gate_up_proj"],
    }


def test_a_head_dim_apart_from_hidden_over_heads_is_used():
    # Gemma and Qwen3 ship head_dim; q_proj's out is heads x head_dim, not hidden.
    config = {"architectures": ["Gemma3ForCausalLM"], **SHAPE, "head_dim": 256}
    dims = identity_from_config(config)["module_dims"]
    assert dims["q_proj"] == [128, 512]
    assert dims["o_proj"] == [512, 128]


def test_a_multimodal_wrapper_is_read_through_its_text_config():
    config = {"architectures": ["Gemma3ForCausalLM"], "text_config": {**SHAPE, "head_dim": 64}}
    assert identity_from_config(config)["module_dims"]["k_proj"] == [128, 64]


def test_a_moe_family_is_sized_on_its_attention_only():
    config = {"architectures": ["MixtralForCausalLM"], **SHAPE, "num_local_experts": 4}
    dims = identity_from_config(config)["module_dims"]
    assert set(dims) == {"q_proj", "k_proj", "v_proj", "o_proj", "embed_tokens", "lm_head"}


def test_an_unknown_architecture_has_no_dims():
    assert (
        identity_from_config({"architectures": ["GPT2LMHeadModel"], **SHAPE})["module_dims"] == {}
    )
