"""Reads a base model's identity from its config.json, and knows which LoRA
target modules each architecture family has and their shapes."""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import ValidationFailed

# Families whose decoder layers use the Llama projection names.
LLAMA_LIKE = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
}


def module_dims_for(identity: dict) -> dict[str, list[int]]:
    """{module: [in_features, out_features]} for a Llama-like architecture."""
    if identity.get("architecture") not in LLAMA_LIKE:
        return {}
    hidden = identity["hidden_size"]
    heads = identity.get("num_attention_heads") or 1
    kv_heads = identity.get("num_key_value_heads") or heads
    head_dim = identity.get("head_dim") or hidden // heads
    inter = identity["intermediate_size"]
    return {
        "q_proj": [hidden, heads * head_dim],
        "k_proj": [hidden, kv_heads * head_dim],
        "v_proj": [hidden, kv_heads * head_dim],
        "o_proj": [heads * head_dim, hidden],
        "gate_proj": [hidden, inter],
        "up_proj": [hidden, inter],
        "down_proj": [inter, hidden],
    }


def identity_from_config(config: dict) -> dict:
    architectures = config.get("architectures") or []
    try:
        identity = {
            "architecture": architectures[0] if architectures else config.get("model_type", ""),
            "hidden_size": int(config["hidden_size"]),
            "intermediate_size": int(config.get("intermediate_size") or 0) or None,
            "num_layers": int(config["num_hidden_layers"]),
            "num_attention_heads": int(config.get("num_attention_heads") or 0) or None,
            "num_key_value_heads": int(config.get("num_key_value_heads") or 0) or None,
            "vocab_size": int(config["vocab_size"]),
            "head_dim": int(config["head_dim"]) if config.get("head_dim") else None,
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ValidationFailed(
            f"The base model's config.json lacks a usable {error} field.", code="bad_base_config"
        ) from None
    identity["module_dims"] = module_dims_for(identity)
    return identity


def identity_from_path(path: str) -> dict:
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ValidationFailed(f"No config.json at {path}.", code="bad_base_config") from None
    except (OSError, ValueError) as error:
        raise ValidationFailed(
            f"Cannot read {config_path}: {error}", code="bad_base_config"
        ) from None
    if not isinstance(config, dict):
        raise ValidationFailed("config.json is not a JSON object.", code="bad_base_config")
    return identity_from_config(config)
