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
import struct
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
    dtype: str = "float32"  # or float16, float64, bfloat16 (written bit by bit: numpy has none)
    seed: int = 0
    # Multiplies the weights so two adapters with the same shapes differ in content.
    scale: float = 0.01
    extra_config: dict = field(default_factory=dict)
    # Hostile values: "nan" / "inf" in the last lora_B, "-inf" in the first lora_A,
    # "zero_b" every lora_B all zeros (an untrained adapter), "zero_a" every lora_A.
    poison: str | None = None

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
                stored = np.float32 if self.dtype == "bfloat16" else self.dtype
                tensors[f"{prefix}.lora_A.weight"] = (
                    rng.standard_normal((r, fan_in)) * self.scale
                ).astype(stored)
                tensors[f"{prefix}.lora_B.weight"] = (
                    rng.standard_normal((fan_out, r)) * self.scale
                ).astype(stored)
        self._poison(tensors)
        return tensors

    def _poison(self, tensors: dict[str, np.ndarray]) -> None:
        names = list(tensors)
        a_names = [n for n in names if ".lora_A." in n]
        b_names = [n for n in names if ".lora_B." in n]
        if self.poison in ("nan", "inf"):
            tensors[b_names[-1]].flat[-1] = np.nan if self.poison == "nan" else np.inf
        elif self.poison == "-inf":
            tensors[a_names[0]].flat[0] = -np.inf
        elif self.poison in ("zero_b", "zero_a"):
            for name in b_names if self.poison == "zero_b" else a_names:
                tensors[name][...] = 0
                # -0.0 is zero too; it must not make a matrix count as trained.
                tensors[name].flat[0] = -0.0
        elif self.poison is not None:
            raise ValueError(f"unknown poison {self.poison!r}")

    def weights(self) -> bytes:
        if self.dtype == "bfloat16":
            return save_bf16_safetensors(self.tensors())
        return save_safetensors(self.tensors())

    def files(self) -> dict[str, bytes]:
        return {
            "adapter_config.json": json.dumps(self.config(), indent=2).encode(),
            "adapter_model.safetensors": self.weights(),
        }


def bf16_bytes(values: np.ndarray) -> bytes:
    """float32 values as bfloat16 bits (truncated: the top half of each float32)."""
    return (np.ascontiguousarray(values, "<f4").view("<u4") >> 16).astype("<u2").tobytes()


def save_bf16_safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    """A safetensors file of BF16 tensors, laid out as safetensors.torch writes them."""
    header, data, offset = {}, [], 0
    for name, values in tensors.items():
        raw = bf16_bytes(values)
        header[name] = {
            "dtype": "BF16",
            "shape": list(values.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        data.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(data)


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
