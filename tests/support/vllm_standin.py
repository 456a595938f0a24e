"""A STAND-IN for many vLLM servers at once: one asyncio process, one port per
replica, each with its own adapter registry, speaking vLLM 0.32's runtime-LoRA
HTTP contract as recorded in shared/notes/vllm-lora.md.

Real vLLM costs about 650 MB and a core per server, so the scale benchmark
(bench/scale.py) uses this beyond the few real servers this machine carries.
tests/serving/vllm/test_standin_contract.py runs the same calls against this
and a real vLLM server and compares the answers, so the stand-in cannot drift
from the real thing unnoticed.

What it models: plain-text 200 on load/unload; 400 "already loaded" (unless
load_inplace); 404 for a path without adapter_config.json; 500 for a rank above
--max-lora-rank; 404 unload/completion of unknown names; /v1/models with the
base card and one card per adapter (root = lora_path as sent); /health,
/version; --max-cpu-loras as an LRU whose evicted adapters are re-read on their
next request (cold loads cost `cold_load_ms`); completions with deterministic
logprobs derived from the adapter's path and from its weights as read when it
was loaded (the base model has its own), so a replica serving other weights
under the same name answers differently, even from the same path when the files
there were other bytes at load time (as vLLM keeps the weights it read); and
/metrics with vllm:lora_requests_info. What it does not model: real weights,
batching, the engine stall a load causes.

Run: python -m tests.support.vllm_standin --replicas 32 [--base-port 0]
It prints one JSON line {"urls": [...]} when every port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass
class StandinReplica:
    base_model: str = "tiny-llama"
    base_root: str = "/models/tiny-llama"
    version: str = "0.32.0"
    max_lora_rank: int = 16
    max_cpu_loras: int = 4
    load_ms: float = 5.0
    cold_load_ms: float = 20.0
    adapters: dict[str, str] = field(default_factory=dict)
    # A digest of each adapter's weights as read at load (or at a cold re-read).
    weights: dict[str, str] = field(default_factory=dict)
    # LRU of adapters resident in the CPU cache (name -> path).
    resident: OrderedDict = field(default_factory=OrderedDict)
    calls: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)

    def count(self, route: str) -> None:
        self.calls[route] = self.calls.get(route, 0) + 1

    def restart(self) -> None:
        """vLLM keeps nothing across a restart."""
        self.adapters.clear()
        self.resident.clear()
        self.weights.clear()

    async def make_resident(self, name: str) -> None:
        if name in self.resident:
            self.resident.move_to_end(name)
            return
        await asyncio.sleep(self.cold_load_ms / 1000)
        self.resident[name] = self.adapters[name]
        # An evicted adapter is read from its path again, like vLLM does.
        self.weights[name] = _weights_digest(self.adapters[name])
        while len(self.resident) > self.max_cpu_loras:
            self.resident.popitem(last=False)


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status=status,
    )


def _adapter_rank(path: str) -> int | None:
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    return int(config.get("r", 8))


def _weights_digest(path: str) -> str:
    try:
        return hashlib.sha256((Path(path) / "adapter_model.safetensors").read_bytes()).hexdigest()
    except OSError:
        return ""


def _logprobs(seed: str, tokens: int) -> list[float]:
    digest = hashlib.sha256(seed.encode()).digest()
    return [-(digest[i % len(digest)] / 64.0) for i in range(tokens)]


def build_app(replica: StandinReplica) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/health")
    async def health(request):
        replica.count("health")
        return web.Response(text="")

    @routes.get("/version")
    async def version(request):
        replica.count("version")
        return web.json_response({"version": replica.version})

    @routes.get("/v1/models")
    async def models(request):
        replica.count("models")
        cards = [{"id": replica.base_model, "object": "model", "root": replica.base_root}]
        cards[0]["parent"] = None
        cards += [
            {"id": name, "object": "model", "root": root, "parent": replica.base_model}
            for name, root in replica.adapters.items()
        ]
        return web.json_response({"object": "list", "data": cards})

    @routes.post("/v1/load_lora_adapter")
    async def load(request):
        replica.count("load")
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if name in replica.adapters and not body.get("load_inplace"):
            return _error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        rank = _adapter_rank(path or "")
        if rank is None:
            return _error(
                404, f"Loading lora {name} failed: No adapter found for <path>", "NotFoundError"
            )
        if rank > replica.max_lora_rank:
            return _error(
                500,
                f"Loading lora {name} failed: LoRA rank {rank} is greater than "
                f"max_lora_rank {replica.max_lora_rank}.",
                "InternalServerError",
            )
        await asyncio.sleep(replica.load_ms / 1000)
        replica.adapters[name] = path
        replica.resident.pop(name, None)
        await replica.make_resident(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    @routes.post("/v1/unload_lora_adapter")
    async def unload(request):
        replica.count("unload")
        name = (await request.json()).get("lora_name")
        if name not in replica.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del replica.adapters[name]
        replica.weights.pop(name, None)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def complete(request, chat: bool):
        replica.count("completions")
        body = await request.json()
        model = body.get("model")
        if model != replica.base_model and model not in replica.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        replica.count(f"completions:{model}")
        tokens = int(body.get("max_tokens") or 16)
        replica.running[model] = replica.running.get(model, 0) + 1
        try:
            if model != replica.base_model:
                await replica.make_resident(model)
        finally:
            replica.running[model] -= 1
        if model == replica.base_model:
            seed = replica.base_root
        else:
            seed = replica.adapters[model] + "|" + replica.weights.get(model, "")
        values = _logprobs(
            seed + "|" + json.dumps(body.get("prompt", body.get("messages"))), tokens
        )
        text = "".join(chr(97 + int(-v * 4) % 26) for v in values)
        choice = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
            choice["logprobs"] = {"tokens": list(text), "token_logprobs": values}
        return web.json_response(
            {
                "id": f"cmpl-{int(time.time() * 1000)}",
                "object": "chat.completion" if chat else "text_completion",
                "model": model,
                "choices": [choice],
                "usage": {"completion_tokens": tokens},
            }
        )

    @routes.post("/v1/completions")
    async def completions(request):
        return await complete(request, chat=False)

    @routes.post("/v1/chat/completions")
    async def chat_completions(request):
        return await complete(request, chat=True)

    @routes.get("/metrics")
    async def metrics(request):
        replica.count("metrics")
        running = ",".join(name for name, n in replica.running.items() if n > 0)
        text = (
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
            "# TYPE vllm:lora_requests_info gauge\n"
            f'vllm:lora_requests_info{{max_lora="{replica.max_cpu_loras}",'
            f'running_lora_adapters="{running}",waiting_lora_adapters=""}} {time.time()}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.add_routes(routes)
    return app


class StandinFleet:
    """Many stand-in replicas in one event loop, one port each."""

    def __init__(self, count: int, **replica_options):
        self.replicas = [StandinReplica(**replica_options) for _ in range(count)]
        self.urls: list[str] = []
        self._runners: list[web.AppRunner] = []

    async def start(self, host: str = "127.0.0.1") -> list[str]:
        for replica in self.replicas:
            runner = web.AppRunner(build_app(replica), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, 0)
            await site.start()
            port = runner.addresses[0][1]
            self._runners.append(runner)
            self.urls.append(f"http://{host}:{port}")
        return self.urls

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


@contextlib.contextmanager
def running_fleet(count: int, **replica_options) -> Iterator[StandinFleet]:
    """A fleet serving from a background thread's event loop, for tests in this
    process: `fleet.urls` to talk to, `fleet.replicas` to look inside."""
    loop = asyncio.new_event_loop()
    fleet = StandinFleet(count, **replica_options)
    loop.run_until_complete(fleet.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield fleet
    finally:
        asyncio.run_coroutine_threadsafe(fleet.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-cpu-loras", type=int, default=4)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--load-ms", type=float, default=5.0)
    parser.add_argument("--cold-load-ms", type=float, default=20.0)
    parser.add_argument("--base-model", default="tiny-llama")
    args = parser.parse_args(argv)

    async def serve():
        fleet = StandinFleet(
            args.replicas,
            base_model=args.base_model,
            max_cpu_loras=args.max_cpu_loras,
            max_lora_rank=args.max_lora_rank,
            load_ms=args.load_ms,
            cold_load_ms=args.cold_load_ms,
        )
        urls = await fleet.start()
        print(json.dumps({"urls": urls}), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await fleet.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
