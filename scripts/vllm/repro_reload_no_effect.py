"""Reproduce, on vLLM alone, the "no effect" verdict right after a reload
(docs/upstream/vllm-cpu-reload-no-effect.md).

No control plane: one real vLLM server (tests/support/vllm_servers.py), the
product's probe (serving/rules/probe.py: a fixed prompt, 4 greedy tokens with
logprobs) and, each round, what the product's swap does under a running
request:

1. a long streamed request through adapter X runs (under X's current LoRA id);
2. X is unloaded, and once vLLM's /metrics shows no request of X running or
   waiting (the product's settle), X is loaded again from the other version's
   folder (a new LoRA id);
3. the probe goes through X at once, then through the base model; each is
   compared with the answers both versions and the base model gave on a quiet
   server before the rounds.

    .venv/bin/python scripts/vllm/repro_reload_no_effect.py --rounds 20
    .venv/bin/python scripts/vllm/repro_reload_no_effect.py --quiet-reload  # no long request
    .venv/bin/python scripts/vllm/repro_reload_no_effect.py --no-settle     # load under it

--no-settle loads the new version while the old load's long request still
runs, as the product's settle did when a starved engine made no step for
0.5 s (it took "no new record" for "idle"): the probe through X then answers
right, and the base model's probe, batched with the old request, answers
through the last LoRA slot (docs/upstream/vllm-cpu-base-tokens-last-slot.md),
where X's new version sits: exactly X's answer, the "no effect" verdict.

Prints one JSON line per round and a summary; exit status 1 when the probes
through X and through the base model agreed in any round (the product's
"no effect" verdict) or X answered like the base model."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.vllm.repro_unload_crash import wait_idle  # noqa: E402
from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe  # noqa: E402
from tests.support.adapters import AdapterSpec, write_adapter_dir  # noqa: E402
from tests.support.vllm_servers import VLLMServer, ensure_tiny_model  # noqa: E402

BASE = "tiny-llama"
LONG_TOKENS = 240


def probe(base_url: str, model: str) -> Probe | None:
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": PROBE_TOKENS,
            "temperature": 0, "logprobs": 1}  # fmt: skip
    answer = requests.post(base_url + "/v1/completions", json=body, timeout=120)
    return Probe.from_body(answer.json()) if answer.ok else None


def load(base_url: str, name: str, path: str) -> None:
    body = {"lora_name": name, "lora_path": path}
    requests.post(base_url + "/v1/load_lora_adapter", json=body, timeout=60).raise_for_status()


def unload(base_url: str, name: str) -> None:
    requests.post(base_url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def long_request(base_url: str, model: str, running: threading.Event) -> None:
    body = {"model": model, "prompt": "The contract says", "max_tokens": LONG_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    with requests.post(base_url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                running.set()


def same(a: Probe | None, b: Probe | None) -> bool:
    return a is not None and b is not None and a.distance(b) <= 1e-6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--others", type=int, default=2, help="other adapters asked between rounds")
    parser.add_argument("--quiet-reload", action="store_true", help="no long request")
    parser.add_argument("--settle", type=float, default=0.0, help="seconds after the load")
    parser.add_argument("--no-settle", action="store_true", help="load while the old runs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="repro-reload-"))
    server = None
    if args.base_url:
        base_url = args.base_url.rstrip("/")
    else:
        server = VLLMServer(name="repro", model_dir=ensure_tiny_model(), log_dir=work)
        server.start_and_wait(timeout=300)
        base_url = server.base_url
    x = "legal-x"
    paths = [str(write_adapter_dir(work / f"x-v{n}", AdapterSpec(seed=300 + n))) for n in (1, 2)]
    others = []
    for i in range(args.others):
        name = f"other-{i}"
        load(base_url, name, str(write_adapter_dir(work / name, AdapterSpec(seed=400 + i))))
        others.append(name)

    # The answers on a quiet server: the base model's, and each version's.
    base = probe(base_url, BASE)
    expected = []
    for path in paths:
        load(base_url, x, path)
        expected.append(probe(base_url, x))
        unload(base_url, x)
        wait_idle(base_url, x)
    assert all(e is not None and not same(e, base) for e in expected), "a version is inert"
    load(base_url, x, paths[0])
    current, rounds, wrong, no_effect_verdicts = 0, [], 0, 0
    for number in range(args.rounds):
        running = threading.Event()
        thread = None
        if not args.quiet_reload:
            thread = threading.Thread(target=long_request, args=(base_url, x, running))
            thread.start()
            running.wait(60)
        unload(base_url, x)
        if not args.no_settle:
            wait_idle(base_url, x)
        current = 1 - current
        load(base_url, x, paths[current])
        if args.settle:
            time.sleep(args.settle)
        through_x = probe(base_url, x)
        through_base = probe(base_url, BASE)
        if thread is not None:
            thread.join(120)
        for other in others:
            probe(base_url, other)
        seen = (
            "the new version" if same(through_x, expected[current])
            else "the old version" if same(through_x, expected[1 - current])
            else "the base model" if same(through_x, base)
            else "something else"
        )  # fmt: skip
        wrong += seen == "the base model"
        base_seen = (
            "the base model" if same(through_base, base)
            else "X's new version" if same(through_base, expected[current])
            else "X's old version" if same(through_base, expected[1 - current])
            else "something else"
        )  # fmt: skip
        verdict = same(through_x, through_base)
        no_effect_verdicts += verdict
        row = {"round": number, "x_answered_like": seen, "base_answered_like": base_seen,
               "verdict_no_effect": verdict}  # fmt: skip
        rounds.append(row)
        print(json.dumps(row), flush=True)
    alive = requests.get(base_url + "/health", timeout=10).ok
    summary = {
        "vllm": requests.get(base_url + "/version", timeout=10).json().get("version"),
        "rounds": args.rounds,
        "long_request": not args.quiet_reload,
        "x_like_base": wrong,
        "x_like_new": sum(r["x_answered_like"] == "the new version" for r in rounds),
        "x_like_old": sum(r["x_answered_like"] == "the old version" for r in rounds),
        "base_like_x_new": sum(r["base_answered_like"] == "X's new version" for r in rounds),
        "no_effect_verdicts": no_effect_verdicts,
        "alive": alive,
    }
    print(json.dumps(summary))
    if server is not None:
        server.stop()
    return 1 if wrong or no_effect_verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
