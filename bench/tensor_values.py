"""What the tensor value scan (registry/ingest/tensor_values.py) costs per byte.

Both ingest paths already hash every byte with SHA-256 on their one pass; the
scan runs on the same chunks. This feeds one in-memory safetensors file of
LoRA pairs to each, in the chunk size each path uses, and prints MB/s beside
the SHA-256 baseline measured in the same run, with the scan's peak memory.

    .venv/bin/python -m bench.tensor_values [--mb 256] [--dtype F32|F16|BF16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import struct
import time
import tracemalloc

import numpy as np

from bench import results as bench_results
from registry.ingest.tensor_values import TensorValues

RANK, HIDDEN = 16, 4096
ITEM = {"F32": 4, "F16": 2, "BF16": 2}


def make_file(mb: int, dtype: str) -> bytes:
    item = ITEM[dtype]
    pair = 2 * RANK * HIDDEN * item
    layers = max(1, mb * 1024**2 // pair)
    header, offset = {}, 0
    for layer in range(layers):
        for part, shape in (("lora_A", [RANK, HIDDEN]), ("lora_B", [HIDDEN, RANK])):
            n = shape[0] * shape[1] * item
            name = f"base_model.model.model.layers.{layer}.self_attn.q_proj.{part}.weight"
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
    raw = json.dumps(header).encode()
    rng = np.random.default_rng(0)
    values = rng.standard_normal(offset // 4, dtype=np.float32) * 0.01
    if dtype == "F16":
        data = values.astype("<f2").tobytes() + values.astype("<f2").tobytes()
    elif dtype == "BF16":
        bits = (values.view("<u4") >> 16).astype("<u2").tobytes()
        data = bits + bits
    else:
        data = values.astype("<f4").tobytes()
    return struct.pack("<Q", len(raw)) + raw + data[:offset]


def chunks(data: bytes, size: int):
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield view[start : start + size]


def timed(run, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--dtype", default="F32", choices=sorted(ITEM))
    parser.add_argument("--rounds", type=int, default=5)
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.rounds = 8, 1
    out = bench_results.Results("tensor_values", args)
    table = out.table("throughput", ["case", "median MB/s", "min s", "max s"], "tensor value scan")
    data = make_file(args.mb, args.dtype)
    mb = len(data) / 1024**2
    heading = f"{mb:.0f} MiB safetensors, {args.dtype}, rank {RANK} x {HIDDEN}"
    heading += f", {args.rounds} rounds"
    print(heading)
    out.note(heading)
    print(f"{'case':<44} {'median MB/s':>12} {'min..max s':>14}")
    for label, size in (("staging, 1 MiB chunks", 1024**2), ("streamed upload, 64 KiB", 64 * 1024)):

        def sha(size=size):
            digest = hashlib.sha256()
            for chunk in chunks(data, size):
                digest.update(chunk)

        def scan(size=size):
            values = TensorValues()
            for chunk in chunks(data, size):
                values.feed(chunk)
            assert values.finish() is not None

        for name, run in ((f"sha256 (baseline), {label}", sha), (f"value scan, {label}", scan)):
            times = timed(run, args.rounds)
            table.row(name, mb / statistics.median(times), min(times), max(times))
            print(
                f"{name:<44} {mb / statistics.median(times):>12.0f} "
                f"{min(times):>6.2f}..{max(times):.2f}"
            )
    tracemalloc.start()
    values = TensorValues()
    for chunk in chunks(data, 1024**2):
        values.feed(chunk)
    values.finish()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"value scan peak traced memory: {peak / 1024**2:.2f} MiB (file {mb:.0f} MiB)")
    out.note(f"value scan peak traced memory: {peak / 1024**2:.2f} MiB (file {mb:.0f} MiB)")
    out.write()


if __name__ == "__main__":
    main()
