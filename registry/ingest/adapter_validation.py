"""Check a staged folder is a PEFT LoRA adapter vLLM can serve, and describe it.

adapter_config.json and the safetensors header are parsed; the tensor values
are only scanned as numbers (.tensor_values). Pickle weight files are never
loaded: unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from .errors import ArtifactRejected

if TYPE_CHECKING:
    import re2
from .patterns import PatternKeys, compile_target_modules
from .safetensors_header import TensorInfo, read_safetensors_header
from .tensor_values import TensorValues, read_tensor_values

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1024 * 1024
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Files that may ride along with an adapter (model card, tokenizer files).
EXTRA_SUFFIXES = (".md", ".txt", ".json", ".yaml", ".yml", ".model", ".jinja")
MAX_EXTRA_FILE_BYTES = 64 * 1024**2
SERVING_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
SAVABLE_MODULES = {"classifier", "score"}
# init_lora_weights values whose training also rewrites the base weights
# (PiSSA/OLoRA/CorDA subtract the initial adapter from them, LoftQ quantises
# them): saved as they are, the adapter fits only that rewritten base, and vLLM
# applies it to the original one. PEFT's converted save writes
# init_lora_weights true instead. EVA only initialises lora_A from activations
# and leaves the base alone, so it is served like any LoRA.
_CONVERT_HINT = (
    "Save it converted to a plain LoRA: model.save_pretrained(path, "
    "path_initial_model_for_weight_conversion=<the {name} adapter saved before training>); "
    "the converted adapter has init_lora_weights true and twice the rank."
)
BASE_MODIFYING_INITS = {
    "pissa": ("PiSSA", _CONVERT_HINT.format(name="PiSSA-initialised")),
    "olora": ("OLoRA", _CONVERT_HINT.format(name="OLoRA-initialised")),
    "corda": ("CorDA", _CONVERT_HINT.format(name="CorDA-initialised")),
    "loftq": (
        "LoftQ",
        "PEFT cannot convert a LoftQ adapter for the original base model; retrain with "
        "the default initialisation (init_lora_weights true).",
    ),
}

# String inits that only set the adapter's starting weights (vLLM 0.32 loads these;
# any other string it refuses).
PLAIN_INITS = {"gaussian", "eva", "orthogonal", "mica", "lora_ga"}
_RETRAIN = "Retrain without it, as a plain LoRA."
UNSUPPORTED_FEATURES = {
    "lora_bias": (
        "lora_bias_unsupported",
        "lora_B carries a bias vector",
        "Retrain with lora_bias=False.",
    ),
    "alora_invocation_tokens": (
        "alora_unsupported",
        "an Activated LoRA, applied only after its invocation tokens",
        _RETRAIN,
    ),
    "layer_replication": ("layer_replication_unsupported", "layers are replicated", _RETRAIN),
    "use_bdlora": ("bdlora_unsupported", "a block-diagonal LoRA", _RETRAIN),
    "use_qalora": ("qalora_unsupported", "a QA-LoRA", _RETRAIN),
    "trainable_token_indices": (
        "trainable_tokens_unsupported",
        "the embeddings of some tokens are trained as a delta",
        "Retrain without trainable_token_indices, or target embed_tokens with LoRA "
        "(target_modules) on an architecture whose vLLM model serves embedding LoRA.",
    ),
}
# The full input embedding / output head PEFT saves beside their LoRA pair when
# they are targeted (save_embedding_layers="auto"). vLLM skips them on load.
BASE_LAYER_TENSOR = re.compile(
    r"base_model\.model\.(.+\.)?(embed_tokens|lm_head)\.base_layer\.weight"
)
LORA_TENSOR = re.compile(r"base_model\.model\.(?P<path>.+)\.(?P<kind>lora_[AB])\.weight")
EMBEDDING_TENSOR = re.compile(r"base_model\.model\.(?P<path>.+)\.(?P<kind>lora_embedding_[AB])")


@dataclass(frozen=True)
class ModuleShape:
    module: str  # leaf name, e.g. "q_proj"
    in_features: int
    out_features: int
    rank: int


@dataclass(frozen=True)
class AdapterMetadata:
    peft_type: str
    r: int
    lora_alpha: float
    target_modules: tuple[str, ...]  # sorted leaf names actually found
    base_model_name_or_path: str
    tensor_count: int
    parameter_count: int
    dtype: str  # dominant weight dtype, e.g. "float32"
    estimated_memory_bytes: int  # parameter_count * bytes of the serving dtype
    rank_pattern: dict
    module_shapes: tuple[ModuleShape, ...]
    layer_count: int
    config: dict  # the raw parsed adapter_config.json


def inspect_adapter(
    root: Path,
    serving_dtype: str = "float16",
    allow_pickle: bool = False,
    tensor_values: TensorValues | None = None,
) -> AdapterMetadata:
    """Validate the staged adapter in `root` and return what was found.

    `allow_pickle=True` only tolerates pickle files (e.g. a stray
    training_args.bin) next to adapter_model.safetensors; they are never
    loaded, and an adapter whose only weights are pickle is still refused.

    `tensor_values` is the weights file's value scan when the caller already fed
    it the bytes (both ingest paths do, on their one pass); without it the file
    in `root` is read. A streamed upload's local copy holds only the header, so
    it must pass its own.
    """
    if serving_dtype not in SERVING_DTYPE_BYTES:
        raise ValueError(f"unknown serving dtype {serving_dtype!r}")
    root = Path(root)
    names = sorted(p.name for p in root.iterdir() if p.is_file())
    _check_files(root, names, allow_pickle)
    config = _read_config(root / CONFIG_NAME)
    rules = _check_config(config)
    weights = root / WEIGHTS_NAME
    tensors = read_safetensors_header(weights)
    metadata = _check_tensors(tensors, config, rules, serving_dtype)
    if tensor_values is None:
        tensor_values = read_tensor_values(weights)
    _check_values(tensor_values, tensors, weights.stat().st_size)
    return metadata


# --- files -----------------------------------------------------------------------


def _check_files(root: Path, names: list[str], allow_pickle: bool) -> None:
    pickles = [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]
    if pickles and not (allow_pickle and WEIGHTS_NAME in names):
        raise ArtifactRejected(
            "pickle_weights",
            f"{', '.join(pickles)}: pickle files (.bin, .pt, .pth, .pkl, .ckpt) are "
            "refused because loading them can execute arbitrary code. Convert the "
            "weights to adapter_model.safetensors with PEFT "
            "model.save_pretrained(path, safe_serialization=True), or "
            "safetensors.torch.save_file(state_dict, 'adapter_model.safetensors'), and "
            "leave the pickle files out.",
        )
    if CONFIG_NAME not in names:
        raise ArtifactRejected(
            "missing_config",
            f"{CONFIG_NAME} is missing. Upload the folder written by PEFT "
            "save_pretrained, which contains it.",
        )
    weights = [n for n in names if n.endswith(".safetensors")]
    if WEIGHTS_NAME not in names:
        found = f" (found {', '.join(weights)})" if weights else ""
        raise ArtifactRejected(
            "missing_weights",
            f"{WEIGHTS_NAME} is missing{found}. A LoRA adapter needs exactly one "
            f"safetensors file named {WEIGHTS_NAME}; full model weights are not accepted.",
        )
    if len(weights) > 1:
        others = ", ".join(n for n in weights if n != WEIGHTS_NAME)
        raise ArtifactRejected(
            "unexpected_weights",
            f"Only {WEIGHTS_NAME} is accepted as weights; remove {others}.",
        )
    for name in names:
        if name in (CONFIG_NAME, WEIGHTS_NAME) or name in pickles:
            continue
        if not name.lower().endswith(EXTRA_SUFFIXES):
            raise ArtifactRejected(
                "unexpected_file",
                f"{name!r} is not part of a LoRA adapter. Besides {CONFIG_NAME} and "
                f"{WEIGHTS_NAME}, only small text files (README.md, tokenizer files) "
                "are accepted.",
            )
        if (root / name).stat().st_size > MAX_EXTRA_FILE_BYTES:
            raise ArtifactRejected(
                "extra_file_too_large",
                f"{name!r} is larger than {MAX_EXTRA_FILE_BYTES // 1024**2} MiB; extra "
                "files next to the adapter must be small.",
                413,
            )


# --- config ----------------------------------------------------------------------


def _read_config(path: Path) -> dict:
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ArtifactRejected("invalid_config", f"{CONFIG_NAME} is larger than 1 MiB.", 413)
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ArtifactRejected(
            "invalid_config", f"{CONFIG_NAME} is not valid JSON ({error})."
        ) from None
    if not isinstance(config, dict):
        raise ArtifactRejected("invalid_config", f"{CONFIG_NAME} must be a JSON object.")
    return config


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_rank(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class _Rules:
    r: int
    # A tuple of names, an RE2 pattern (see .patterns), or None for "all-linear".
    targets: tuple[str, ...] | re2._Regexp | None
    rank_pattern: dict
    rank_keys: PatternKeys
    modules_to_save: tuple[str, ...]


def _check_config(config: dict) -> _Rules:
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise ArtifactRejected(
            "unsupported_peft_type",
            f'peft_type is {peft_type!r}; only LoRA adapters (peft_type "LORA") can be served.',
        )
    r = config.get("r")
    if not _is_rank(r):
        raise ArtifactRejected("invalid_rank", f"r must be a positive integer, got {r!r}.")
    if "lora_alpha" not in config:
        raise ArtifactRejected("missing_lora_alpha", f"{CONFIG_NAME} has no lora_alpha.")
    if not _is_number(config["lora_alpha"]):
        raise ArtifactRejected(
            "invalid_lora_alpha",
            f"lora_alpha must be a number, got {config['lora_alpha']!r}.",
        )
    targets = _target_rule(config.get("target_modules"))
    _check_init(config.get("init_lora_weights", True))
    _check_unsupported_features(config)

    if config.get("use_dora"):
        raise ArtifactRejected(
            "dora_unsupported",
            "DoRA adapters (use_dora: true) cannot be served by vLLM. Train a plain "
            "LoRA adapter, or merge the DoRA adapter into the base model.",
        )
    bias = config.get("bias", "none")
    if bias not in ("none", None):
        raise ArtifactRejected(
            "bias_unsupported",
            f'bias is {bias!r}; vLLM serves LoRA adapters only with bias "none". '
            'Retrain with bias="none".',
        )
    modules_to_save = config.get("modules_to_save") or []
    if not isinstance(modules_to_save, list) or not set(modules_to_save) <= SAVABLE_MODULES:
        raise ArtifactRejected(
            "modules_to_save_unsupported",
            f"modules_to_save is {modules_to_save!r}; vLLM cannot serve fully trained "
            "modules, only a classifier/score head. Retrain without modules_to_save.",
        )
    rank_pattern = config.get("rank_pattern") or {}
    if not isinstance(rank_pattern, dict) or not all(
        isinstance(k, str) and _is_rank(v) for k, v in rank_pattern.items()
    ):
        raise ArtifactRejected(
            "invalid_rank_pattern",
            "rank_pattern must map module names to positive integer ranks.",
        )
    alpha_pattern = config.get("alpha_pattern") or {}
    if not isinstance(alpha_pattern, dict) or not all(
        isinstance(k, str) and _is_number(v) for k, v in alpha_pattern.items()
    ):
        raise ArtifactRejected(
            "invalid_alpha_pattern",
            "alpha_pattern must map module names to numbers.",
        )
    # Its values do not change shapes, but PEFT reads its keys as regexes exactly
    # like rank_pattern's, so an invalid or hostile key is refused the same way.
    PatternKeys("alpha_pattern", list(alpha_pattern))
    rank_keys = PatternKeys("rank_pattern", list(rank_pattern))
    return _Rules(r, targets, rank_pattern, rank_keys, tuple(modules_to_save))


def _check_init(init) -> None:
    if not isinstance(init, str):
        return
    for prefix, (method, fix) in BASE_MODIFYING_INITS.items():
        # PEFT spells the PiSSA variants pissa_niter_<n>.
        if init.lower().startswith(prefix):
            raise ArtifactRejected(
                "base_modifying_init",
                f"init_lora_weights is {init!r}: {method} changes the base model's weights "
                "during training, so this adapter only fits that changed base and vLLM "
                f"would apply it to the original one. {fix}",
            )
    if init.lower() not in PLAIN_INITS:
        raise ArtifactRejected(
            "unsupported_init",
            f"init_lora_weights is {init!r}, which vLLM refuses to load (it serves "
            f"{', '.join(sorted(PLAIN_INITS))} or true/false). If the adapter is a plain "
            "LoRA, set init_lora_weights to true in adapter_config.json.",
        )


def _check_unsupported_features(config: dict) -> None:
    """PEFT options that change what the adapter computes and that vLLM 0.32
    refuses to load (vllm/lora/peft_helper.py `_validate_features`)."""
    for field_name, (code, what, fix) in UNSUPPORTED_FEATURES.items():
        if config.get(field_name):
            raise ArtifactRejected(
                code,
                f"{field_name} is set ({what}); vLLM cannot serve such an adapter. {fix}",
            )


def _target_rule(targets) -> tuple[str, ...] | re2._Regexp | None:
    if targets is None:
        raise ArtifactRejected(
            "missing_target_modules",
            f"{CONFIG_NAME} has no target_modules, so it is unclear which layers the "
            "adapter modifies.",
        )
    if targets == "all-linear":
        return None
    if isinstance(targets, str):
        return compile_target_modules(targets)
    if isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets):
        return tuple(targets)
    raise ArtifactRejected(
        "invalid_target_modules",
        f"target_modules must be a non-empty list of module names or a regex, got {targets!r}.",
    )


def _targets_match(targets: tuple[str, ...], path: str) -> str | None:
    # PEFT matches list entries as the full module name or a dotted suffix of it.
    return next((t for t in targets if path == t or path.endswith("." + t)), None)


def _rank_for(path: str, rules: _Rules) -> tuple[int, str | None]:
    key = rules.rank_keys.first_match(path)
    if key is None:
        return rules.r, None
    return rules.rank_pattern[key], key


# --- tensors ---------------------------------------------------------------------


def _reject_tensor(name: str) -> ArtifactRejected:
    hint = "Only LoRA weights (…lora_A.weight / …lora_B.weight) may be in the adapter."
    if "lora_magnitude_vector" in name:
        hint = "This is a DoRA magnitude vector; DoRA adapters cannot be served by vLLM."
    elif ".lora_" in name:
        hint = (
            "LoRA tensors must be named base_model.model.<module>.lora_A.weight / "
            ".lora_B.weight, as PEFT save_pretrained writes them."
        )
    return ArtifactRejected("unexpected_tensor", f"Tensor {name!r} is not a LoRA weight. {hint}")


def _check_tensors(
    tensors: list[TensorInfo], config: dict, rules: _Rules, serving_dtype: str
) -> AdapterMetadata:
    if not tensors:
        raise ArtifactRejected("no_lora_tensors", f"{WEIGHTS_NAME} contains no tensors.")
    pairs: dict[str, dict[str, TensorInfo]] = {}
    saved_head = None
    if rules.modules_to_save:
        heads = "|".join(map(re.escape, rules.modules_to_save))
        saved_head = re.compile(
            rf"base_model\.model\.(.+\.)?({heads})(\.modules_to_save)?\.(weight|bias)"
        )
    params_by_dtype: Counter[str] = Counter()
    base_layers = 0
    for tensor in tensors:
        if BASE_LAYER_TENSOR.fullmatch(tensor.name):
            base_layers += tensor.numel
            continue
        if tensor.dtype not in DTYPE_NAMES:
            raise ArtifactRejected(
                "unsupported_dtype",
                f"Tensor {tensor.name!r} has dtype {tensor.dtype}; LoRA weights must be "
                "float16, bfloat16 or float32.",
            )
        params_by_dtype[tensor.dtype] += tensor.numel
        match = LORA_TENSOR.fullmatch(tensor.name) or EMBEDDING_TENSOR.fullmatch(tensor.name)
        if match is None:
            if saved_head and saved_head.fullmatch(tensor.name):
                continue
            raise _reject_tensor(tensor.name)
        if len(tensor.shape) != 2 or 0 in tensor.shape:
            raise ArtifactRejected(
                "invalid_lora_shape",
                f"Tensor {tensor.name!r} has shape {list(tensor.shape)}; LoRA weights "
                "must be non-empty 2-D matrices.",
            )
        kind = match["kind"]
        slot = pairs.setdefault(match["path"], {})
        slot[kind] = tensor

    shapes: dict[str, ModuleShape] = {}
    layers: set[str] = set()
    leaves_found: set[str] = set()
    for path, slot in sorted(pairs.items()):
        a, b = _pair(path, slot)
        rank = a.shape[0]
        if b.shape[1] != rank:
            raise ArtifactRejected(
                "rank_mismatch",
                f"Module {path!r}: lora_A has rank {rank} but lora_B has rank "
                f"{b.shape[1]}; A must be (r, in) and B (out, r).",
            )
        expected, key = _rank_for(path, rules)
        if rank != expected:
            source = f"rank_pattern[{key!r}]" if key else "r"
            raise ArtifactRejected(
                "rank_mismatch",
                f"Module {path!r} has rank {rank} but the config says {source} = "
                f"{expected}. Fix adapter_config.json to match the weights.",
            )
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(rules.targets, tuple):
            target = _targets_match(rules.targets, path)
            if target is None:
                raise ArtifactRejected(
                    "target_modules_mismatch",
                    f"The weights adapt {path!r}, but {leaf!r} is not in target_modules "
                    f"{list(rules.targets)}.",
                )
        elif rules.targets is not None and not rules.targets.fullmatch(path):
            raise ArtifactRejected(
                "target_modules_mismatch",
                f"The weights adapt {path!r}, which the target_modules regex "
                f"{rules.targets.pattern!r} does not match.",
            )
        leaves_found.add(leaf)
        layer = next((p for p in path.split(".") if p.isdigit()), None)
        if layer is not None:
            layers.add(layer)
        current = ModuleShape(leaf, a.shape[1], b.shape[0], rank)
        previous = shapes.get(leaf)
        if previous:
            current = ModuleShape(
                leaf,
                max(previous.in_features, current.in_features),
                max(previous.out_features, current.out_features),
                max(previous.rank, current.rank),
            )
        shapes[leaf] = current

    # A target_modules entry without tensors is not refused: PEFT lists what it
    # was asked for (all-linear before exclude_modules, every layer before
    # layers_to_transform), and vLLM, like PEFT, adapts what the tensors hold.
    if not pairs:
        raise ArtifactRejected("no_lora_tensors", f"{WEIGHTS_NAME} contains no LoRA weights.")
    # The saved base embedding/head copies are not adapter weights and vLLM never
    # loads them: left out of the size that sets the serving memory.
    parameter_count = sum(t.numel for t in tensors) - base_layers
    dominant = max(sorted(params_by_dtype), key=lambda d: params_by_dtype[d])
    return AdapterMetadata(
        peft_type="LORA",
        r=rules.r,
        lora_alpha=config["lora_alpha"],
        target_modules=tuple(sorted(leaves_found)),
        base_model_name_or_path=_text(config.get("base_model_name_or_path")),
        tensor_count=len(tensors),
        parameter_count=parameter_count,
        dtype=DTYPE_NAMES[dominant],
        estimated_memory_bytes=parameter_count * SERVING_DTYPE_BYTES[serving_dtype],
        rank_pattern=dict(rules.rank_pattern),
        module_shapes=tuple(shapes[leaf] for leaf in sorted(shapes)),
        layer_count=len(layers),
        config=config,
    )


def _check_values(values: TensorValues, tensors: list[TensorInfo], file_size: int) -> None:
    if values.size != file_size:
        # A scan of other bytes than the file checked above: a wiring bug, not the upload's.
        raise ValueError(f"tensor values were fed {values.size} bytes, the file has {file_size}")
    report = values.finish()
    if report is None:
        # The header check passed, so this should not happen; refuse rather than trust.
        raise ArtifactRejected(
            "bad_safetensors",
            f"{WEIGHTS_NAME} could not be read to check its values: {values.unreadable}.",
        )
    if report.nonfinite:
        shown = ", ".join(repr(n) for n in report.nonfinite[:3])
        more = f" and {len(report.nonfinite) - 3} more" if len(report.nonfinite) > 3 else ""
        raise ArtifactRejected(
            "non_finite_weights",
            f"Tensor {shown}{more} contains NaN or Inf. vLLM loads such an adapter and then "
            "every completion that uses it fails. Training diverged or the file was "
            "corrupted: check the run's loss, then save the weights again.",
        )
    pairs: dict[str, dict[str, str]] = {}
    for tensor in tensors:
        match = LORA_TENSOR.fullmatch(tensor.name) or EMBEDDING_TENSOR.fullmatch(tensor.name)
        if match:
            pairs.setdefault(match["path"], {})[match["kind"][-1]] = tensor.name
    inert = [p for p, s in pairs.items() if s["A"] in report.all_zero or s["B"] in report.all_zero]
    if pairs and len(inert) == len(pairs):
        every_b = all(s["B"] in report.all_zero for s in pairs.values())
        which = "Every lora_B matrix is" if every_b else "In every module lora_A or lora_B is"
        raise ArtifactRejected(
            "adapter_changes_nothing",
            f"{which} all zeros, so the adapter changes nothing: vLLM would serve exactly "
            "the base model's output. PEFT initialises lora_B to zero, so these look like "
            "weights saved before training; upload the trained weights.",
        )


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _pair(path: str, slot: dict[str, TensorInfo]) -> tuple[TensorInfo, TensorInfo]:
    a = slot.get("lora_A") or slot.get("lora_embedding_A")
    b = slot.get("lora_B") or slot.get("lora_embedding_B")
    mixed = ("lora_A" in slot or "lora_B" in slot) and (
        "lora_embedding_A" in slot or "lora_embedding_B" in slot
    )
    if a is None or b is None or mixed:
        have = ", ".join(sorted(slot))
        raise ArtifactRejected(
            "incomplete_lora_pair",
            f"Module {path!r} has only {have}; every LoRA module needs both an A and "
            "a B matrix of the same kind.",
        )
    return a, b
