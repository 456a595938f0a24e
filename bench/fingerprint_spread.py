"""How far apart the fingerprint probe lands, on real vLLM replicas (CPU,
tiny float32 model): the figures behind SERVING_FINGERPRINT_TOLERANCE.

    .venv/bin/python -m bench.fingerprint_spread [--repeats 5]

The probe is serving/rules/probe.py's: a fixed prompt, 4 greedy tokens with
their logprobs; the distance is the largest logprob difference (infinite when
the tokens differ). Measured:

  baseline            the base model probed again on the same replica
  same files          one adapter folder loaded on every replica; probes across
                      them (and on a third replica running 2 threads), again
                      after an unload + load, and while other requests keep the
                      engine batching
  different weights   other adapters of the same shapes: other seeds, and the
                      same seed with every weight scaled by 1% (a near miss)

A tolerance must sit above everything in "same files" and below everything in
"different weights". Real vLLM (no stand-in). --replica-urls uses running
servers (1 to 3; the cases that need another replica, or one on 2 threads, are
left out with fewer); --smoke: 2 repeats.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench import results as bench_results
from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_servers import ensure_tiny_model, ensure_vllm_installed, start_servers

SERVED_BASE = "tiny-llama"


def probe(url: str, model: str) -> Probe:
    response = requests.post(
        url + "/v1/completions",
        json={
            "model": model,
            "prompt": PROBE_PROMPT,
            "max_tokens": PROBE_TOKENS,
            "temperature": 0,
            "logprobs": 1,
        },
        timeout=240,
    )
    response.raise_for_status()
    result = Probe.from_body(response.json())
    assert result is not None, response.text
    return result


def load(url: str, name: str, path: Path) -> None:
    response = requests.post(
        url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=60
    )
    response.raise_for_status()


def unload(url: str, name: str) -> None:
    requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def spread(probes: list[Probe], reference: Probe) -> float:
    return max(reference.distance(p) for p in probes)


def under_traffic(url: str, model: str, other: str, repeats: int) -> list[Probe]:
    """Probes while two clients keep other completions in flight (batching)."""
    stop = threading.Event()

    def client(target: str) -> None:
        while not stop.is_set():
            requests.post(
                url + "/v1/completions",
                json={"model": target, "prompt": "Hello there", "max_tokens": 8},
                timeout=240,
            )

    threads = [
        threading.Thread(target=client, args=(t,), daemon=True) for t in (SERVED_BASE, other)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    try:
        return [probe(url, model) for _ in range(repeats)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(240)


def fmt(value: float) -> str:
    return "inf (tokens differ)" if math.isinf(value) else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replica-urls", default="", help="1-3 running vLLM servers")
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 2
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        servers = []
        urls = [url.strip() for url in args.replica_urls.split(",") if url.strip()]
        if not urls:
            ensure_vllm_installed()
            options = {
                "model_dir": ensure_tiny_model(),
                "served_name": SERVED_BASE,
                "max_loras": 2,
                "max_cpu_loras": 4,
                "max_lora_rank": 16,
                "log_dir": root / "logs",
                "timeout": 300,
            }
            servers = start_servers(2, names=["spread-a", "spread-b"], **options)
            # Another thread count splits the sums differently: float32 rounding shows.
            servers += start_servers(1, names=["spread-2-threads"], threads=2, **options)
            urls = [s.base_url for s in servers]
        try:
            rows, different = measure(root, urls, args.repeats)
        finally:
            for server in servers:
                server.stop()

    out = bench_results.Results("fingerprint_spread", args)
    out.note(f"real vLLM 0.32 (no stand-in), {len(urls)} replica(s), {args.repeats} repeats")
    table = out.table("spread", ["case", "largest logprob difference"], "fingerprint spread")
    width = max(len(label) for label, _ in rows)
    print(f"\n{'case':<{width}}  largest logprob difference")
    for label, value in rows:
        print(f"{label:<{width}}  {fmt(value)}")
        table.row(label, fmt(value))
    same = max(value for label, value in rows if label.startswith("same files"))
    summary = f"same files, worst: {fmt(same)}; different weights, closest: {fmt(min(different))}"
    print("\n" + summary)
    out.note(summary)
    out.write()


def measure(root: Path, urls: list[str], repeats: int):
    a = urls[0]
    b = urls[1] if len(urls) > 1 else a  # the replica that is reloaded
    c = urls[2] if len(urls) > 2 else None  # the one on 2 threads

    def repeat(url: str, model: str) -> list[Probe]:
        return [probe(url, model) for _ in range(repeats)]

    right = write_adapter_dir(root / "right", AdapterSpec(seed=2, scale=0.05))
    other = write_adapter_dir(root / "other", AdapterSpec(seed=9, scale=0.05))
    for url in dict.fromkeys(urls):
        unload(url, "contracts")  # a shared server may hold them from an earlier run
        unload(url, "other")
        load(url, "contracts", right)
        load(url, "other", other)
        probe(url, SERVED_BASE)  # warm-up
    try:
        base = probe(a, SERVED_BASE)
        rows = [("baseline: base model again", spread(repeat(a, SERVED_BASE), base))]
        reference = probe(a, "contracts")
        rows.append(("same files, same replica", spread(repeat(a, "contracts"), reference)))
        if b != a:
            rows.append(("same files, other replica", spread(repeat(b, "contracts"), reference)))
        if c:
            rows.append(
                ("same files, replica on 2 threads", spread(repeat(c, "contracts"), reference))
            )
        unload(b, "contracts")
        load(b, "contracts", right)
        rows.append(("same files, after unload + load", spread(repeat(b, "contracts"), reference)))
        busy = spread(under_traffic(b, "contracts", "other", repeats), reference)
        rows.append(("same files, under traffic", busy))

        different = []
        variants = [(f"seed {s}", AdapterSpec(seed=s, scale=0.05)) for s in (3, 4, 5, 6)]
        variants += [
            ("seed 2, weights x1.01", AdapterSpec(seed=2, scale=0.0505)),
            ("seed 2, weights x1.001", AdapterSpec(seed=2, scale=0.05005)),
        ]
        for label, spec in variants:
            path = write_adapter_dir(root / label.replace(" ", "-").replace(",", ""), spec)
            unload(b, "contracts")
            load(b, "contracts", path)
            distance = reference.distance(probe(b, "contracts"))
            different.append(distance)
            rows.append((f"different weights: {label}", distance))
    finally:
        for url in dict.fromkeys(urls):
            unload(url, "contracts")
            unload(url, "other")
    return rows, different


if __name__ == "__main__":
    main()
