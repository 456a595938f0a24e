"""Generate a tiny, deterministic Llama model that vLLM (CPU) can serve.

Run with the vLLM venv's python (it has torch, transformers and tokenizers):

    .venv-vllm/bin/python scripts/vllm/make_tiny_model.py var/models/tiny-llama

Shapes (hidden 128, intermediate 256, 2 layers, 2 heads / 2 kv heads, head
size 64) match tests/support/adapters.py, so the PEFT adapters built there
load into the served model. Weights are random (fixed seed); the output is
gibberish, which is all the tests need. No hub access is used.

Idempotent: if OUT_DIR/config.json exists and OUT_DIR/.tiny-model.json holds
the same spec, nothing is done.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the generated model changes in any way.
GENERATOR_VERSION = 1
MARKER = ".tiny-model.json"

HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 2
KV_HEADS = 2
MAX_POSITIONS = 512
VOCAB_TARGET = 512

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny language model answers every question with confident nonsense.",
    "Adapters are small low-rank matrices added to the attention projections.",
    "The control plane loads, swaps and unloads adapters on every replica.",
    "Hello! How are you today? I am fine, thank you.",
    "user assistant system: what is the capital of France? Paris.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
]

# Order matters: ids 0..3 in the vocab.
SPECIAL_TOKENS = (
    ("unk_token", "<unk>"),
    ("bos_token", "<s>"),
    ("eos_token", "</s>"),
    ("pad_token", "<pad>"),
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def spec(name: str, seed: int) -> dict:
    return {
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "seed": seed,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
    }


def is_up_to_date(out_dir: Path, want: dict) -> bool:
    marker = out_dir / MARKER
    if not (out_dir / "config.json").is_file() or not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()) == want
    except (OSError, ValueError):
        return False


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = dict(SPECIAL_TOKENS)
    tok = Tokenizer(models.BPE(unk_token=special["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=1,
        special_tokens=list(special.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        **special,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out_dir: Path, name: str, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    # Round the vocab up to a multiple of 64; unused rows are fine.
    vocab_size = ((len(tokenizer) + 63) // 64) * 64
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config.do_sample = False

    # Write into a temp dir next to OUT_DIR, then move into place, so a
    # half-written model never looks complete.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(spec(name, seed), indent=2, sort_keys=True))
        # mkdtemp makes a 0700 dir and safetensors writes 0600 files:
        # make the model readable by any local user (e.g. a server in a
        # container running as another uid).
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--name", default="tiny-llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)

    out_dir = args.out_dir.resolve()
    want = spec(args.name, args.seed)
    if not args.force and is_up_to_date(out_dir, want):
        print(f"tiny model already present: {out_dir}")
        return 0
    build(out_dir, args.name, args.seed)
    print(f"tiny model written: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
