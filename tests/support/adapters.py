"""Builds real PEFT LoRA adapter folders and archives without torch.

The layout is exactly what `peft.save_pretrained` writes: `adapter_config.json`
plus `adapter_model.safetensors` with tensors named
`base_model.model.model.layers.<i>.<block>.<module>.lora_{A,B}.weight`.
The default shapes fit the tiny Llama the vLLM tier generates
(hidden 128, intermediate 256, 2 layers), so the same adapters load into vLLM.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save as save_safetensors

TINY_BASE_MODEL = "tiny-llama"
TINY_HIDDEN = 128
TINY_INTERMEDIATE = 256
TINY_LAYERS = 2

# (block, in_features, out_features) per Llama projection, for the tiny model.
LLAMA_MODULES = {
    "q_proj": ("self_attn", TINY_HIDDEN, TINY_HIDDEN),
    "k_proj": ("self_attn", TINY_HIDDEN, TINY_HIDDEN),
    "v_proj": ("self_attn", TINY_HIDDEN, TINY_HIDDEN),
    "o_proj": ("self_attn", TINY_HIDDEN, TINY_HIDDEN),
    "gate_proj": ("mlp", TINY_HIDDEN, TINY_INTERMEDIATE),
    "up_proj": ("mlp", TINY_HIDDEN, TINY_INTERMEDIATE),
    "down_proj": ("mlp", TINY_INTERMEDIATE, TINY_HIDDEN),
}


@dataclass
class AdapterSpec:
    r: int = 8
    lora_alpha: int = 16
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    base_model: str = TINY_BASE_MODEL
    layers: int = TINY_LAYERS
    hidden: int = TINY_HIDDEN
    intermediate: int = TINY_INTERMEDIATE
    dtype: str = "float32"
    seed: int = 0
    # Multiplies the weights so two adapters with the same shapes differ in content.
    scale: float = 0.01
    extra_config: dict = field(default_factory=dict)

    def config(self) -> dict:
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": 0.0,
            "target_modules": list(self.target_modules),
            "base_model_name_or_path": self.base_model,
            "bias": "none",
            "fan_in_fan_out": False,
            "modules_to_save": None,
            "use_dora": False,
            "rank_pattern": {},
            "alpha_pattern": {},
        }
        config.update(self.extra_config)
        return config

    def module_shape(self, module: str) -> tuple[str, int, int]:
        block, fan_in, fan_out = LLAMA_MODULES[module]
        resize = {TINY_HIDDEN: self.hidden, TINY_INTERMEDIATE: self.intermediate}
        return block, resize[fan_in], resize[fan_out]

    def tensors(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        tensors: dict[str, np.ndarray] = {}
        rank_pattern = self.config().get("rank_pattern") or {}
        for layer in range(self.layers):
            for module in self.target_modules:
                block, fan_in, fan_out = self.module_shape(module)
                prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
                r = rank_pattern.get(module, self.r)
                tensors[f"{prefix}.lora_A.weight"] = (
                    rng.standard_normal((r, fan_in)) * self.scale
                ).astype(self.dtype)
                tensors[f"{prefix}.lora_B.weight"] = (
                    rng.standard_normal((fan_out, r)) * self.scale
                ).astype(self.dtype)
        return tensors

    def files(self) -> dict[str, bytes]:
        return {
            "adapter_config.json": json.dumps(self.config(), indent=2).encode(),
            "adapter_model.safetensors": save_safetensors(self.tensors()),
        }


def write_adapter_dir(path: Path, spec: AdapterSpec | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in (spec or AdapterSpec()).files().items():
        (path / name).write_bytes(data)
    return path


def tar_gz_bytes(files: dict[str, bytes]) -> bytes:
    """The same files give the same bytes (gzip's header time is fixed), as a
    pipeline's retry of one archive does: idempotency keys compare bodies."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w") as archive,
    ):
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def adapter_tar_gz(spec: AdapterSpec | None = None) -> bytes:
    return tar_gz_bytes((spec or AdapterSpec()).files())


def adapter_zip(spec: AdapterSpec | None = None) -> bytes:
    return zip_bytes((spec or AdapterSpec()).files())
