"""Measure, on vLLM alone, how often an adapter request gets the BASE model's
answer while many adapters cycle through a small host cache (the "no effect"
verifications of tests/serving/vllm/test_many_adapters_real.py;
docs/upstream/vllm-base-answers-under-churn.md).

No control plane: one real vLLM server (tests/support/vllm_servers.py), and
`--adapters` PEFT adapters that each change the greedy probe. Phase 1 does
what a burst of promotions does: `--loaders` threads each load a new adapter,
then ask it the probe, then ask the base model the same probe, while the
others load theirs. Phase 2 asks every adapter the probe again, one at a
time on a quiet server. Optional `--clients` ask random adapters meanwhile.

    .venv/bin/python scripts/vllm/repro_base_answers.py
    .venv/bin/python scripts/vllm/repro_base_answers.py --adapters 120 --clients 2

Prints, per phase, how many adapter answers equal the base model's answer
(exact tokens, logprobs within 1e-6) and how many differ from the adapter's
own quiet answer.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support.adapters import AdapterSpec, write_adapter_dir  # noqa: E402
from tests.support.vllm_servers import VLLMServer, ensure_tiny_model  # noqa: E402

PROMPT = "The parties agree that the contract"  # serving/rules/probe.py's
TOKENS = 4
SAME = 1e-6


def probe(session: requests.Session, base_url: str, model: str):
    body = {
        "model": model, "prompt": PROMPT, "max_tokens": TOKENS,
        "temperature": 0, "logprobs": 1,
    }  # fmt: skip
    answer = session.post(base_url + "/v1/completions", json=body, timeout=120)
    if answer.status_code != 200:
        return None
    logprobs = answer.json()["choices"][0]["logprobs"]
    return tuple(logprobs["tokens"]), tuple(float(v) for v in logprobs["token_logprobs"])


def same(a, b) -> bool:
    return (
        a is not None
        and b is not None
        and a[0] == b[0]
        and all(abs(x - y) <= SAME for x, y in zip(a[1], b[1], strict=True))
    )


def distance(a, b) -> float | str:
    if a is None or b is None:
        return "no answer"
    if a[0] != b[0]:
        return "tokens differ"
    return max(abs(x - y) for x, y in zip(a[1], b[1], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--base-url")
    parser.add_argument("--adapters", type=int, default=60)
    parser.add_argument("--max-loras", type=int, default=2)
    parser.add_argument("--max-cpu-loras", type=int, default=4)
    parser.add_argument("--loaders", type=int, default=2, help="threads loading+probing at once")
    parser.add_argument("--clients", type=int, default=0, help="threads asking random adapters")
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument(
        "--mixed", type=int, default=10, help="base probes batched with one adapter"
    )
    parser.add_argument("--seed", type=int, default=100)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="repro-base-"))
    server = None
    if args.base_url:
        base_url = args.base_url.rstrip("/")
    else:
        server = VLLMServer(
            name="repro-base", model_dir=ensure_tiny_model(), max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras, log_dir=work,
        )  # fmt: skip
        server.start_and_wait(timeout=300)
        base_url = server.base_url
    version = requests.get(base_url + "/version", timeout=10).json().get("version")
    session = requests.Session()
    base = probe(session, base_url, "tiny-llama")
    stamp = int(time.time())
    names = [f"base-check-{stamp}-{i:03d}" for i in range(args.adapters)]
    paths = {
        name: str(write_adapter_dir(work / name, AdapterSpec(seed=args.seed + i, scale=args.scale)))
        for i, name in enumerate(names)
    }
    burst: dict[str, tuple] = {}
    burst_base_differs: list[str] = []
    burst_base_answers: dict[str, tuple] = {}
    loaded: list[str] = []
    todo = list(names)
    lock = threading.Lock()
    stop = threading.Event()

    def loader() -> None:
        own = requests.Session()
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop(0)
            own.post(
                base_url + "/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": paths[name]},
                timeout=120,
            ).raise_for_status()
            with lock:
                loaded.append(name)
            answer = probe(own, base_url, name)
            base_now = probe(own, base_url, "tiny-llama")
            with lock:
                burst[name] = answer
                if not same(base_now, base):
                    burst_base_differs.append(name)
                    burst_base_answers[name] = base_now

    def client(seed: int) -> None:
        rng = random.Random(seed)
        own = requests.Session()
        while not stop.is_set():
            with lock:
                choices = list(loaded)
            if choices:
                probe(own, base_url, rng.choice(choices))
            else:
                time.sleep(0.05)

    started = time.monotonic()
    clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in clients:
        thread.start()
    loaders = [threading.Thread(target=loader) for _ in range(args.loaders)]
    for thread in loaders:
        thread.start()
    for thread in loaders:
        thread.join()
    burst_seconds = time.monotonic() - started
    stop.set()
    for thread in clients:
        thread.join(timeout=130)

    # Quiet: one request at a time, each adapter re-read from disk (evicted).
    quiet = {name: probe(session, base_url, name) for name in names}
    again = {name: probe(session, base_url, name) for name in names}

    # Mixed: the base probe while one long request through adapter X runs, so
    # that every step of the probe is batched with X's request.
    mixed = {}
    for name in names[: args.mixed]:
        body = {"model": name, "prompt": PROMPT, "max_tokens": 150, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        long = threading.Thread(
            target=requests.post,
            args=(base_url + "/v1/completions",),
            kwargs={"json": body, "timeout": 300},
        )
        long.start()
        time.sleep(0.3)
        answer = probe(session, base_url, "tiny-llama")
        long.join()
        mixed[name] = answer
    result = {
        "vllm": version,
        "adapters": args.adapters,
        "max_loras": args.max_loras,
        "max_cpu_loras": args.max_cpu_loras,
        "loaders": args.loaders,
        "clients": args.clients,
        "burst_seconds": round(burst_seconds, 1),
        "burst_failed": sorted(n for n, a in burst.items() if a is None),
        "burst_equal_base": sorted(n for n, a in burst.items() if same(a, base)),
        "burst_unlike_quiet": sorted(
            n for n, a in burst.items() if a is not None and not same(a, quiet[n])
        ),
        # The base model's answer, asked right after an adapter's, that was not
        # the base model's quiet answer: whose answer it was instead.
        "burst_base_probe_changed": {
            name: {
                "distance": distance(answer, base),
                "equals_quiet_of": sorted(n for n in names if same(answer, quiet[n])),
            }
            for name, answer in burst_base_answers.items()
        },
        "mixed_base_probes": len(mixed),
        "mixed_base_equal_base": sorted(n for n, a in mixed.items() if same(a, base)),
        "mixed_base_equal_that_adapter": sorted(n for n, a in mixed.items() if same(a, quiet[n])),
        "quiet_equal_base": sorted(n for n, a in quiet.items() if same(a, base)),
        "quiet_unrepeatable": sorted(n for n in names if not same(quiet[n], again[n])),
    }
    print(json.dumps(result, indent=2))
    if server is not None:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
