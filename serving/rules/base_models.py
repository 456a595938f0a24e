"""Reads a base model's identity from its config.json, and knows which LoRA
target modules each architecture family has and their shapes.

Module names are the ones an adapter's tensors carry (PEFT names them after the
transformers modules). vLLM packs some of them into one layer
(`packed_modules_mapping` on its model class) and splits the adapter's A/B
pairs over the packed slices on load; the gate compares against the unpacked
names, with each packed family recorded here as vLLM 0.32 maps it.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import ValidationFailed

# Separate q/k/v and gate/up projections; vLLM packs them into qkv_proj and
# gate_up_proj (packed_modules_mapping of LlamaForCausalLM and the classes below).
SEPARATE_PROJECTIONS = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "GraniteForCausalLM",
}
# Phi-3 stores q/k/v and gate/up already fused; vLLM maps qkv_proj -> [qkv_proj]
# and gate_up_proj -> [gate_up_proj], so adapters target the fused names.
FUSED_PROJECTIONS = {"Phi3ForCausalLM"}
# Mixture-of-experts families: LoRA on the attention projections (the experts'
# fused weights are PEFT target_parameters, which the gate does not size).
MOE_ATTENTION_ONLY = {
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "GraniteMoeForCausalLM",
}
PACKED_MODULES = {
    **{
        name: {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
        for name in SEPARATE_PROJECTIONS
    },
    **{
        name: {"qkv_proj": ["qkv_proj"], "gate_up_proj": ["gate_up_proj"]}
        for name in FUSED_PROJECTIONS
    },
    **{name: {"qkv_proj": ["q_proj", "k_proj", "v_proj"]} for name in MOE_ATTENTION_ONLY},
}
# Classes whose vLLM model declares embedding_modules (embed_tokens, lm_head): only
# there does vLLM serve LoRA on the input embeddings and the output head. Mistral
# sets it empty on purpose; Qwen2 and Gemma do not declare it.
EMBEDDING_LORA = {
    "LlamaForCausalLM",
    "Phi3ForCausalLM",
    "Qwen3ForCausalLM",
    "GraniteForCausalLM",
    "MixtralForCausalLM",
    "Qwen3MoeForCausalLM",
    "GraniteMoeForCausalLM",
}
# Not per decoder layer: sized once, from vocab_size and hidden_size.
EMBEDDING_MODULES = ("embed_tokens", "lm_head")
KNOWN_ARCHITECTURES = SEPARATE_PROJECTIONS | FUSED_PROJECTIONS | MOE_ATTENTION_ONLY
# Kept for callers that ask "does this look like Llama?".
LLAMA_LIKE = KNOWN_ARCHITECTURES


def module_dims_for(identity: dict) -> dict[str, list[int]]:
    """{module: [in_features, out_features]} of every module an adapter for this
    architecture may target, as its tensors are shaped (lora_A is r x in,
    lora_B out x r; for embed_tokens, lora_embedding_A is r x vocab)."""
    architecture = identity.get("architecture")
    if architecture not in KNOWN_ARCHITECTURES:
        return {}
    hidden = identity["hidden_size"]
    heads = identity.get("num_attention_heads") or 1
    kv_heads = identity.get("num_key_value_heads") or heads
    head_dim = identity.get("head_dim") or hidden // heads
    inter = identity.get("intermediate_size")
    q, kv = heads * head_dim, kv_heads * head_dim
    dims = {"o_proj": [q, hidden]}
    if architecture in FUSED_PROJECTIONS:
        dims["qkv_proj"] = [hidden, q + 2 * kv]
    else:
        dims.update({"q_proj": [hidden, q], "k_proj": [hidden, kv], "v_proj": [hidden, kv]})
    if inter and architecture in FUSED_PROJECTIONS:
        dims.update({"gate_up_proj": [hidden, 2 * inter], "down_proj": [inter, hidden]})
    elif inter and architecture in SEPARATE_PROJECTIONS:
        dims.update(
            {"gate_proj": [hidden, inter], "up_proj": [hidden, inter], "down_proj": [inter, hidden]}
        )
    vocab = identity.get("vocab_size")
    if vocab and architecture in EMBEDDING_LORA:
        dims.update({"embed_tokens": [vocab, hidden], "lm_head": [hidden, vocab]})
    return dims


def _text_config(config: dict) -> dict:
    # Multimodal wrappers (Gemma 3, Mistral 3) keep the decoder's fields apart.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def identity_from_config(config: dict) -> dict:
    architectures = config.get("architectures") or []
    fields = _text_config(config)
    try:
        identity = {
            "architecture": architectures[0] if architectures else config.get("model_type", ""),
            "hidden_size": int(fields["hidden_size"]),
            "intermediate_size": int(fields.get("intermediate_size") or 0) or None,
            "num_layers": int(fields["num_hidden_layers"]),
            "num_attention_heads": int(fields.get("num_attention_heads") or 0) or None,
            "num_key_value_heads": int(fields.get("num_key_value_heads") or 0) or None,
            "vocab_size": int(fields["vocab_size"]),
            "head_dim": int(fields["head_dim"]) if fields.get("head_dim") else None,
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
