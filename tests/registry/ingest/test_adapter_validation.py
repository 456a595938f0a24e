from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from registry.ingest import (
    AdapterMetadata,
    ArtifactRejected,
    ModuleShape,
    inspect_adapter,
    stage_and_inspect,
)
from tests.registry.ingest.hostile_corpus import as_sources
from tests.support.adapters import AdapterSpec, adapter_tar_gz, write_adapter_dir


def write(tmp_path, spec: AdapterSpec | None = None, **files: bytes):
    root = write_adapter_dir(tmp_path / "adapter", spec)
    for name, data in files.items():
        (root / name.replace("__", ".")).write_bytes(data)
    return root


def test_the_default_adapter_passes_with_exact_metadata(tmp_path):
    dest = tmp_path / "staged"
    dest.mkdir()
    staged, metadata = stage_and_inspect(as_sources([("a.tar.gz", adapter_tar_gz())]), dest)

    # 2 layers x 2 modules x (A: 8x128 + B: 128x8)
    parameter_count = 2 * 2 * (8 * 128 + 128 * 8)
    assert parameter_count == 8192
    assert metadata == AdapterMetadata(
        peft_type="LORA",
        r=8,
        lora_alpha=16,
        target_modules=("q_proj", "v_proj"),
        base_model_name_or_path="tiny-llama",
        tensor_count=8,
        parameter_count=parameter_count,
        dtype="float32",
        estimated_memory_bytes=parameter_count * 2,
        rank_pattern={},
        module_shapes=(
            ModuleShape("q_proj", in_features=128, out_features=128, rank=8),
            ModuleShape("v_proj", in_features=128, out_features=128, rank=8),
        ),
        layer_count=2,
        config=AdapterSpec().config(),
    )
    assert staged.total_size > 0


@pytest.mark.parametrize(
    ("serving_dtype", "bytes_per_param"), [("float16", 2), ("bfloat16", 2), ("float32", 4)]
)
def test_memory_estimate_follows_the_serving_dtype(serving_dtype, bytes_per_param, tmp_path):
    metadata = inspect_adapter(write(tmp_path), serving_dtype=serving_dtype)
    assert metadata.estimated_memory_bytes == 8192 * bytes_per_param


def test_it_refuses_an_unknown_serving_dtype(tmp_path):
    with pytest.raises(ValueError):
        inspect_adapter(write(tmp_path), serving_dtype="int4")


def test_it_describes_mlp_modules_and_half_precision(tmp_path):
    spec = AdapterSpec(r=4, target_modules=["gate_proj", "down_proj"], dtype="float16", layers=3)
    metadata = inspect_adapter(write(tmp_path, spec))
    assert metadata.module_shapes == (
        ModuleShape("down_proj", in_features=256, out_features=128, rank=4),
        ModuleShape("gate_proj", in_features=128, out_features=256, rank=4),
    )
    assert metadata.dtype == "float16"
    assert metadata.layer_count == 3
    assert metadata.tensor_count == 3 * 2 * 2
    assert metadata.parameter_count == 3 * 2 * (4 * 128 + 256 * 4)


def test_rank_pattern_overrides_r_for_matching_modules(tmp_path):
    spec = AdapterSpec(extra_config={"rank_pattern": {"q_proj": 4}})
    metadata = inspect_adapter(write(tmp_path, spec))
    assert metadata.rank_pattern == {"q_proj": 4}
    assert metadata.module_shapes[0] == ModuleShape("q_proj", 128, 128, 4)
    assert metadata.module_shapes[1] == ModuleShape("v_proj", 128, 128, 8)


def test_rank_pattern_keys_may_be_full_module_paths(tmp_path):
    spec = AdapterSpec(extra_config={"rank_pattern": {"model.layers.0.self_attn.q_proj": 8}})
    assert inspect_adapter(write(tmp_path, spec)).r == 8


def test_target_modules_may_be_a_regex(tmp_path):
    spec = AdapterSpec(extra_config={"target_modules": r".*\.self_attn\.(q|v)_proj"})
    assert inspect_adapter(write(tmp_path, spec)).target_modules == ("q_proj", "v_proj")


def test_a_regex_that_misses_a_module_is_rejected(tmp_path):
    spec = AdapterSpec(extra_config={"target_modules": r".*\.q_proj"})
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(write(tmp_path, spec))
    assert caught.value.code == "target_modules_mismatch"
    assert "v_proj" in caught.value.message


def test_target_modules_may_be_dotted_suffixes(tmp_path):
    spec = AdapterSpec(extra_config={"target_modules": ["self_attn.q_proj", "v_proj"]})
    assert inspect_adapter(write(tmp_path, spec)).target_modules == ("q_proj", "v_proj")


def test_embedding_lora_tensors_are_accepted(tmp_path):
    tensors = AdapterSpec().tensors()
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = np.zeros(
        (8, 1000), np.float32
    )
    tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = np.zeros((128, 8), np.float32)
    spec = AdapterSpec(target_modules=["q_proj", "v_proj"])
    root = write(tmp_path, spec, adapter_model__safetensors=save_safetensors(tensors))
    config = spec.config() | {"target_modules": ["q_proj", "v_proj", "embed_tokens"]}
    (root / "adapter_config.json").write_text(json.dumps(config))
    metadata = inspect_adapter(root)
    assert "embed_tokens" in metadata.target_modules
    assert ModuleShape("embed_tokens", 1000, 128, 8) in metadata.module_shapes


def test_a_score_head_in_modules_to_save_is_allowed(tmp_path):
    tensors = AdapterSpec().tensors()
    tensors["base_model.model.score.weight"] = np.zeros((2, 128), np.float32)
    spec = AdapterSpec(extra_config={"modules_to_save": ["score"]})
    root = write(tmp_path, spec, adapter_model__safetensors=save_safetensors(tensors))
    metadata = inspect_adapter(root)
    assert metadata.tensor_count == 9
    assert metadata.parameter_count == 8192 + 256
    assert metadata.target_modules == ("q_proj", "v_proj")


def test_allow_pickle_only_tolerates_pickle_next_to_safetensors(tmp_path):
    root = write(tmp_path, training_args__bin=b"\x80\x04.")
    assert inspect_adapter(root, allow_pickle=True).r == 8
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)
    assert caught.value.code == "pickle_weights"
    assert "safe_serialization=True" in caught.value.message

    (root / "adapter_model.safetensors").unlink()
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root, allow_pickle=True)
    assert caught.value.code == "pickle_weights"


def test_readme_and_tokenizer_files_may_ride_along(tmp_path):
    root = write(tmp_path, README__md=b"# card", tokenizer__json=b"{}")
    assert inspect_adapter(root).r == 8


def test_a_second_safetensors_file_is_rejected(tmp_path):
    root = write(tmp_path, model__safetensors=b"")
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)
    assert caught.value.code == "unexpected_weights"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"lora_alpha": "16"}, "invalid_lora_alpha"),
        ({"target_modules": []}, "invalid_target_modules"),
        ({"target_modules": "("}, "invalid_target_modules"),
        ({"rank_pattern": {"q_proj": 0}}, "invalid_rank_pattern"),
        ({"modules_to_save": "score"}, "modules_to_save_unsupported"),
    ],
)
def test_it_rejects_invalid_config_values(change, code, tmp_path):
    spec = AdapterSpec()
    root = write(tmp_path, spec)
    (root / "adapter_config.json").write_text(json.dumps(spec.config() | change))
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)
    assert caught.value.code == code


def test_a_target_without_tensors_is_accepted_as_peft_writes_it_for_exclude_modules(tmp_path):
    # PEFT saves target_modules as asked (all-linear before exclude_modules); vLLM and
    # PEFT adapt what the tensors hold (tests/conformance, "exclude_modules").
    spec = AdapterSpec(extra_config={"target_modules": ["q_proj", "v_proj", "k_proj"]})
    assert inspect_adapter(write(tmp_path, spec)).target_modules == ("q_proj", "v_proj")


def test_the_base_embedding_peft_saves_beside_an_embedding_lora_is_accepted(tmp_path):
    # save_embedding_layers="auto" writes the full embedding next to its LoRA pair;
    # vLLM skips it on load, so it is not counted as adapter weights either.
    tensors = AdapterSpec().tensors()
    tensors["base_model.model.model.embed_tokens.base_layer.weight"] = np.ones(
        (1000, 128), np.float32
    )
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = np.ones((8, 1000), np.float32)
    tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = np.ones((128, 8), np.float32)
    spec = AdapterSpec()
    root = write(tmp_path, spec, adapter_model__safetensors=save_safetensors(tensors))
    config = spec.config() | {"target_modules": ["q_proj", "v_proj", "embed_tokens"]}
    (root / "adapter_config.json").write_text(json.dumps(config))
    metadata = inspect_adapter(root)
    assert metadata.parameter_count == 8192 + 8 * 1000 + 128 * 8


@pytest.mark.parametrize(
    ("change", "code", "fix"),
    [
        ({"lora_bias": True}, "lora_bias_unsupported", "lora_bias=False"),
        ({"alora_invocation_tokens": [5, 6]}, "alora_unsupported", "plain LoRA"),
        ({"layer_replication": [[0, 2]]}, "layer_replication_unsupported", "plain LoRA"),
        ({"use_qalora": True}, "qalora_unsupported", "plain LoRA"),
        ({"trainable_token_indices": [5]}, "trainable_tokens_unsupported", "Retrain without"),
        ({"init_lora_weights": "pissa"}, "base_modifying_init", "path_initial_model"),
        ({"init_lora_weights": "kaiming"}, "unsupported_init", "init_lora_weights to true"),
    ],
)
def test_it_refuses_what_vllm_refuses_naming_the_fix(change, code, fix, tmp_path):
    spec = AdapterSpec()
    root = write(tmp_path, spec)
    (root / "adapter_config.json").write_text(json.dumps(spec.config() | change))
    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)
    assert caught.value.code == code
    assert fix in str(caught.value)


@pytest.mark.parametrize("init", ["gaussian", "orthogonal", "eva", False])
def test_inits_that_leave_the_base_alone_are_accepted(init, tmp_path):
    spec = AdapterSpec(extra_config={"init_lora_weights": init})
    assert inspect_adapter(write(tmp_path, spec)).r == 8
