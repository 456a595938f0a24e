"""Generate the conformance tier's cases with real PEFT and transformers.

Run with the vLLM venv's python (torch, transformers, peft):

    .venv-vllm/bin/python scripts/conformance/generate.py MATRIX.json CACHE_DIR

MATRIX.json is {"architectures": {name: spec}, "cases": [case, ...]} as
tests/conformance/matrix.py writes it. For every architecture a tiny random
model is built locally (no hub) under CACHE_DIR/models/<key>; for every case
an adapter is made with `LoraConfig` + `get_peft_model`, its trainable
parameters set to seeded random values (as training would leave them),
saved with `save_pretrained`, optionally damaged, and PEFT's ground truth
computed: the saved adapter loaded back with `PeftModel.from_pretrained`
onto a fresh base and decoded greedily in float32. Every output folder is
named by a content hash of what made it, so a second run reuses it.

Prints one JSON line per case: {"id", "dir", "truth"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

# Bump when what a case or a model folder holds changes in any way.
GENERATOR_VERSION = 4
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))


def content_key(*parts) -> str:
    blob = json.dumps([GENERATOR_VERSION, *parts], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def versions() -> dict:
    import peft
    import torch
    import transformers

    return {
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


# -- tiny models ----------------------------------------------------------------


def build_model(spec: dict, out_dir: Path) -> None:
    import torch
    import transformers
    from make_tiny_model import build_tokenizer

    torch.manual_seed(spec.get("seed", 0))
    tokenizer = build_tokenizer()
    vocab_size = ((len(tokenizer) + 63) // 64) * 64
    config_class = getattr(transformers, spec["config_class"])
    fields = {
        "vocab_size": vocab_size,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        **spec["config"],
    }
    config = config_class(**fields)
    config.architectures = [spec["architecture"]]
    model_class = getattr(transformers, spec["architecture"])
    model = model_class(config).to(torch.float32).eval()
    # Wider weights than the default 0.02: a random tiny model's next-token
    # distribution is otherwise nearly flat, and greedy decoding on near-ties
    # compares rounding noise instead of the adapter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and "norm" not in name:
                param.normal_(0.0, spec.get("init_std", 0.08))
    model.generation_config.do_sample = False
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_model(name: str, spec: dict, cache: Path) -> Path:
    out = cache / "models" / f"{name}-{content_key(spec, versions())}"
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        build_model(spec, out)
    return out


def load_base(model_dir: Path):
    import torch
    import transformers

    config = json.loads((model_dir / "config.json").read_text())
    model_class = getattr(transformers, config["architectures"][0])
    return model_class.from_pretrained(model_dir, dtype=torch.float32).eval()


# -- adapters -------------------------------------------------------------------

DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def make_adapter(model_dir: Path, case: dict, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    base = load_base(model_dir)
    options = dict(case["lora"])
    config = LoraConfig(**options)
    torch.manual_seed(case.get("seed", 1))
    model = get_peft_model(base, config)
    if case.get("train", True):
        # What training leaves: every trainable tensor moved off its init.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.requires_grad:
                    scale = case.get("scale", 0.15)
                    if "magnitude" in name:
                        param.mul_(1.0 + 0.2 * torch.rand_like(param))
                    else:
                        param.add_(torch.randn_like(param) * scale)
    dtype = getattr(torch, case.get("dtype", "float32"))
    if dtype != torch.float32:
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.data = param.data.to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    # What a run that loaded its base from a hub id records (here the path).
    config_path = out / "adapter_config.json"
    saved = json.loads(config_path.read_text())
    saved["base_model_name_or_path"] = case["base_model"]
    config_path.write_text(json.dumps(saved, indent=2))
    # The folder a data scientist uploads: keep only what PEFT wrote.
    for child in out.iterdir():
        if child.name not in ("adapter_config.json", "adapter_model.safetensors"):
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.chmod(0o755)
    for child in out.iterdir():
        child.chmod(0o644)


# -- damage ---------------------------------------------------------------------


def _read_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _write_header(path: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def _tensor_names(header: dict) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


def _pick(header: dict, kind: str, index: int) -> str:
    names = [n for n in _tensor_names(header) if f".{kind}." in n or n.endswith(f".{kind}")]
    return names[index]


VALUE_BYTES = {
    # dtype: {value: little-endian bytes}
    "F32": {"nan": struct.pack("<f", float("nan")), "inf": struct.pack("<f", float("inf"))},
    "F16": {"nan": b"\x00\x7e", "inf": b"\x00\x7c"},
    "BF16": {"nan": b"\xc0\x7f", "inf": b"\x80\x7f"},
}
ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


def damage(folder: Path, how: dict) -> None:
    weights = folder / "adapter_model.safetensors"
    config_path = folder / "adapter_config.json"
    kind = how["kind"]
    if kind == "value":
        header, body = _read_header(weights)
        name = _pick(header, how.get("tensor", "lora_B"), how.get("index", -1))
        info = header[name]
        start, end = info["data_offsets"]
        item = ITEM_BYTES[info["dtype"]]
        count = (end - start) // item
        position = {"first": 0, "middle": count // 2, "last": count - 1}[how["position"]]
        offset = start + position * item
        patch = VALUE_BYTES[info["dtype"]][how["value"]]
        body = body[:offset] + patch + body[offset + item :]
        _write_header(weights, header, body)
    elif kind == "header":
        header, body = _read_header(weights)
        name = _tensor_names(header)[0]
        lie = how["lie"]
        if lie == "offsets_past_end":
            start, end = header[name]["data_offsets"]
            header[name]["data_offsets"] = [start, end + 4096]
        elif lie == "dtype":
            header[name]["dtype"] = "F16" if header[name]["dtype"] == "F32" else "F32"
        elif lie == "shape":
            header[name]["shape"] = [header[name]["shape"][0] * 2, header[name]["shape"][1]]
        elif lie == "overlap":
            other = _tensor_names(header)[1]
            header[other]["data_offsets"] = header[name]["data_offsets"]
        _write_header(weights, header, body)
    elif kind == "config":
        config = json.loads(config_path.read_text())
        for key, value in how["set"].items():
            config[key] = value
        config_path.write_text(json.dumps(config, indent=2))
    elif kind == "drop_tensors":
        # A valid file without them (safetensors' own writer): config and
        # weights disagree, nothing else is wrong.
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        save_file({k: v for k, v in tensors.items() if how["match"] not in k}, weights)
    elif kind == "zero_b":
        header, body = _read_header(weights)
        body = bytearray(body)
        for name in _tensor_names(header):
            if ".lora_B." in name:
                start, end = header[name]["data_offsets"]
                body[start:end] = bytes(end - start)
        _write_header(weights, header, bytes(body))
    else:
        raise ValueError(f"unknown damage {kind!r}")


# -- ground truth ---------------------------------------------------------------


def greedy(model, prompt: list[int], steps: int) -> dict:
    """PEFT's greedy continuation: per step the chosen token, its logprob, and the
    margin to the runner-up (how close the step is to a tie)."""
    import torch

    ids = list(prompt)
    tokens, logprobs, margins = [], [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            log_softmax = torch.log_softmax(logits, dim=-1)
            top = torch.topk(log_softmax, 2)
            token = int(top.indices[0])
            tokens.append(token)
            logprobs.append(float(top.values[0]))
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(token)
    return {"tokens": tokens, "logprobs": logprobs, "margins": margins}


def ground_truth(model_dir: Path, adapter_dir: Path, prompt: list[int], steps: int) -> dict:
    from peft import PeftModel

    base = greedy(load_base(model_dir), prompt, steps)
    try:
        model = PeftModel.from_pretrained(load_base(model_dir), adapter_dir).eval()
        peft = greedy(model, prompt, steps)
    except Exception as error:  # noqa: BLE001 - PEFT refusing is a finding, not a crash
        return {"base": base, "peft": None, "peft_error": f"{type(error).__name__}: {error}"[:500]}
    return {"base": base, "peft": peft, "peft_error": None}


def ensure_case(case: dict, model_dir: Path, cache: Path, prompt: list[int], steps: int) -> Path:
    key = content_key(case, model_dir.name, versions(), prompt, steps)
    out = cache / "cases" / f"{case['id']}-{key}"
    if (out / "truth.json").is_file():
        return out
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        adapter = tmp / "adapter"
        make_adapter(model_dir, case, adapter)
        if case.get("damage"):
            damage(adapter, case["damage"])
        # PEFT's truth is what PEFT computes from the very files uploaded, damage
        # and all: where PEFT cannot load them, nothing is to be served.
        truth = ground_truth(model_dir, adapter, prompt, steps)
        truth["versions"] = versions()
        (tmp / "truth.json").write_text(json.dumps(truth, indent=1))
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix", type=Path)
    parser.add_argument("cache", type=Path)
    args = parser.parse_args(argv)
    matrix = json.loads(args.matrix.read_text())
    cache = args.cache.resolve()
    (cache / "cases").mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    models = {}
    for name, spec in matrix["architectures"].items():
        models[name] = ensure_model(name, spec, cache)
        print(json.dumps({"architecture": name, "dir": str(models[name])}), flush=True)
    for case in matrix["cases"]:
        folder = ensure_case(
            case, models[case["architecture"]], cache, matrix["prompt"], matrix["steps"]
        )
        print(json.dumps({"id": case["id"], "dir": str(folder)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
