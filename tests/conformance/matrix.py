"""The conformance matrix: the architectures (tiny random configs, built locally)
and the adapters made on them with real PEFT (scripts/conformance/generate.py).

`make test` runs QUICK: every option on Llama, every architecture with the
options that touch what differs between architectures (module names, packing,
embeddings, dtypes). CONFORMANCE_FULL=1 runs every option on every
architecture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Head size 64: vLLM's CPU attention supports only some head sizes.
_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}

ARCHITECTURES: dict[str, dict] = {
    "llama": {"config_class": "LlamaConfig", "architecture": "LlamaForCausalLM", "config": _SHAPE},
    "qwen2": {
        "config_class": "Qwen2Config",
        "architecture": "Qwen2ForCausalLM",
        # Qwen2's q/k/v projections carry biases: bias="lora_only" has something to save.
        "config": {**_SHAPE, "use_sliding_window": False},
    },
    "qwen3": {"config_class": "Qwen3Config", "architecture": "Qwen3ForCausalLM", "config": _SHAPE},
    "mistral": {
        "config_class": "MistralConfig",
        "architecture": "MistralForCausalLM",
        "config": {**_SHAPE, "sliding_window": None},
    },
    "granite": {
        "config_class": "GraniteConfig",
        "architecture": "GraniteForCausalLM",
        "config": {
            **_SHAPE,
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.125,
            "logits_scaling": 2.0,
        },
    },
    "gemma3": {
        "config_class": "Gemma3TextConfig",
        "architecture": "Gemma3ForCausalLM",
        "config": {
            **_SHAPE,
            "query_pre_attn_scalar": 64,
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    },
    "phi3": {
        "config_class": "Phi3Config",
        "architecture": "Phi3ForCausalLM",
        "config": {k: v for k, v in _SHAPE.items() if k != "head_dim"},
    },
}

ALL_LLAMA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_PHI3 = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def every_module(arch: str) -> list[str]:
    return ALL_PHI3 if arch == "phi3" else ALL_LLAMA


def attention_pair(arch: str) -> list[str]:
    return ["qkv_proj", "o_proj"] if arch == "phi3" else ["q_proj", "v_proj"]


@dataclass(frozen=True)
class Case:
    id: str
    architecture: str
    option: str  # the row of the table: which LoraConfig option or damage
    lora: dict
    dtype: str = "float32"
    damage: dict | None = None
    train: bool = True
    # The product's refusal must name this reason code (None: any refusal, or serve).
    # Refused by the product's policy although vLLM serves it the way PEFT
    # computes it here: why (shown in the table).
    policy: str = ""
    seed: int = 1

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "architecture": self.architecture,
            "lora": self.lora,
            "dtype": self.dtype,
            "damage": self.damage,
            "train": self.train,
            "seed": self.seed,
            "base_model": f"conformance/{self.architecture}",
        }


def _base(arch: str, **extra) -> dict:
    return {"r": 8, "lora_alpha": 16, "target_modules": attention_pair(arch), **extra}


def option_cases(arch: str) -> list[Case]:
    """Every LoraConfig option that changes what save_pretrained writes."""
    pair = attention_pair(arch)
    first = pair[0]
    every = every_module(arch)
    layer_regex = (
        r"model\.layers\.\d+\.self_attn\.(qkv_proj|o_proj)"
        if arch == "phi3"
        else r"model\.layers\.\d+\.self_attn\.(q_proj|v_proj)"
    )
    c = [
        Case("default", arch, "target_modules list (r 8, alpha 16)", _base(arch)),
        Case("rank4_alpha32", arch, "r / lora_alpha", _base(arch, r=4, lora_alpha=32)),
        Case("rank16", arch, "r at max_lora_rank", _base(arch, r=16, lora_alpha=8)),
        Case("rank32", arch, "r above max_lora_rank", _base(arch, r=32, lora_alpha=32)),
        Case("rank_pattern", arch, "rank_pattern", _base(arch, rank_pattern={first: 4})),
        Case("alpha_pattern", arch, "alpha_pattern", _base(arch, alpha_pattern={first: 64})),
        Case("rslora", arch, "use_rslora", _base(arch, use_rslora=True)),
        Case(
            "all_modules",
            arch,
            "target_modules every projection",
            _base(arch, target_modules=every),
        ),
        Case("regex", arch, "target_modules regex", _base(arch, target_modules=layer_regex)),
        Case(
            "all_linear",
            arch,
            "target_modules all-linear",
            _base(arch, target_modules="all-linear"),
        ),
        Case(
            "exclude",
            arch,
            "exclude_modules",
            _base(arch, target_modules="all-linear", exclude_modules=["down_proj", "o_proj"]),
        ),
        Case(
            "layers",
            arch,
            "layers_to_transform + layers_pattern",
            _base(arch, layers_to_transform=[1], layers_pattern="layers"),
        ),
        Case("bias_lora_only", arch, 'bias "lora_only"', _base(arch, bias="lora_only")),
        Case("bias_all", arch, 'bias "all"', _base(arch, bias="all")),
        Case("lora_bias", arch, "lora_bias", _base(arch, lora_bias=True)),
        Case("save_lm_head", arch, "modules_to_save", _base(arch, modules_to_save=["lm_head"])),
        Case(
            "trainable_tokens",
            arch,
            "trainable_token_indices",
            _base(arch, trainable_token_indices=[5, 6, 7]),
        ),
        Case(
            "embed",
            arch,
            "target embed_tokens",
            _base(arch, target_modules=[*pair, "embed_tokens"]),
        ),
        Case("lm_head", arch, "target lm_head", _base(arch, target_modules=[*pair, "lm_head"])),
        Case("init_false", arch, "init_lora_weights false", _base(arch, init_lora_weights=False)),
        Case(
            "init_gaussian",
            arch,
            'init_lora_weights "gaussian"',
            _base(arch, init_lora_weights="gaussian"),
        ),
        Case(
            "init_orthogonal",
            arch,
            'init_lora_weights "orthogonal"',
            _base(arch, init_lora_weights="orthogonal"),
        ),
        Case(
            "init_pissa", arch, 'init_lora_weights "pissa"', _base(arch, init_lora_weights="pissa")
        ),
        Case(
            "init_pissa_niter",
            arch,
            'init_lora_weights "pissa_niter_2"',
            _base(arch, init_lora_weights="pissa_niter_2"),
        ),
        Case(
            "init_olora", arch, 'init_lora_weights "olora"', _base(arch, init_lora_weights="olora")
        ),
        Case("dora", arch, "use_dora", _base(arch, use_dora=True)),
        Case(
            "alora",
            arch,
            "alora_invocation_tokens",
            _base(arch, alora_invocation_tokens=[5, 6]),
        ),
        Case("fp16", arch, "saved float16", _base(arch), dtype="float16"),
        Case("bf16", arch, "saved bfloat16", _base(arch), dtype="bfloat16"),
    ]
    return c


def damage_cases(arch: str) -> list[Case]:
    base = _base(arch)
    cases = [
        Case(
            "untrained",
            arch,
            "untrained (every lora_B zero)",
            base,
            train=False,
            policy="it changes nothing: the base model's output under an adapter's name",
        ),
        Case(
            "base_other",
            arch,
            "base_model_name_or_path of another model",
            base,
            damage={"kind": "config", "set": {"base_model_name_or_path": "other-org/other-model"}},
            policy="vLLM never checks the base: on the real other model it serves garbage",
        ),
        Case(
            "cfg_r_string",
            arch,
            "config r a string",
            base,
            damage={"kind": "config", "set": {"r": "8"}},
        ),
        Case(
            "cfg_alpha_string",
            arch,
            "config lora_alpha a string",
            base,
            damage={"kind": "config", "set": {"lora_alpha": "16"}},
        ),
        Case(
            "cfg_targets_int",
            arch,
            "config target_modules a number",
            base,
            damage={"kind": "config", "set": {"target_modules": 7}},
        ),
        Case(
            "cfg_rank_pattern_string",
            arch,
            "config rank_pattern value a string",
            base,
            damage={"kind": "config", "set": {"rank_pattern": {"q_proj": "4"}}},
        ),
        Case(
            "cfg_r_disagrees",
            arch,
            "config r disagrees with the tensors",
            base,
            damage={"kind": "config", "set": {"r": 4}},
        ),
        Case(
            "cfg_target_without_tensors",
            arch,
            "target_modules names a module without tensors",
            base,
            damage={"kind": "drop_tensors", "match": "v_proj"},
        ),
        Case(
            "header_offsets",
            arch,
            "safetensors header: offsets past the end",
            base,
            damage={"kind": "header", "lie": "offsets_past_end"},
        ),
        Case(
            "header_dtype",
            arch,
            "safetensors header: wrong dtype",
            base,
            damage={"kind": "header", "lie": "dtype"},
        ),
        Case(
            "header_shape",
            arch,
            "safetensors header: wrong shape",
            base,
            damage={"kind": "header", "lie": "shape"},
        ),
        Case(
            "header_overlap",
            arch,
            "safetensors header: overlapping tensors",
            base,
            damage={"kind": "header", "lie": "overlap"},
        ),
    ]
    for dtype in ("float32", "float16", "bfloat16"):
        for value, position, tensor in (
            ("nan", "last", "lora_B"),
            ("inf", "first", "lora_A"),
            ("nan", "middle", "lora_A"),
        ):
            if dtype != "float32" and position == "middle":
                continue
            cases.append(
                Case(
                    f"value_{dtype}_{value}_{tensor}_{position}",
                    arch,
                    f"{value} in {tensor} ({dtype}, {position} element)",
                    base,
                    dtype=dtype,
                    damage={
                        "kind": "value",
                        "value": value,
                        "position": position,
                        "tensor": tensor,
                    },
                )
            )
    return cases


# Options that differ between architectures; every architecture runs these in make test.
PER_ARCHITECTURE = {
    "default",
    "all_modules",
    "all_linear",
    "rank_pattern",
    "embed",
    "lm_head",
    "bias_lora_only",
    "bf16",
}
QUICK_ARCHITECTURE = "llama"


def full_matrix() -> bool:
    return os.environ.get("CONFORMANCE_FULL") == "1"


def cases() -> list[Case]:
    chosen = []
    for arch in ARCHITECTURES:
        for case in option_cases(arch) + damage_cases(arch):
            if full_matrix() or arch == QUICK_ARCHITECTURE or case.id in PER_ARCHITECTURE:
                chosen.append(case)
    return chosen


PROMPT = [1, 40, 75, 120, 33, 200, 90, 61]
STEPS = 6


def matrix_json(selected: list[Case]) -> dict:
    return {
        "architectures": ARCHITECTURES,
        "cases": [c.as_dict() | {"id": f"{c.architecture}-{c.id}"} for c in selected],
        "prompt": PROMPT,
        "steps": STEPS,
    }
