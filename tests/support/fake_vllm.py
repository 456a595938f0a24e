"""A stateful stand-in for one vLLM server's runtime-LoRA API, for unit tests of
error paths. It mimics the contract measured in shared/notes/vllm-lora.md
(plain-text 200s, JSON errors, 400 already loaded, 404 unknown). The behaviours
the product promises are ALSO tested against real vLLM (tests/serving/vllm/)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeVLLM:
    def __init__(self, base_model: str = "tiny-llama", version: str = "0.32.0"):
        self.base_model = base_model
        self.version = version
        self.adapters: dict[str, str] = {}
        self.requests: list[tuple[str, str, dict]] = []
        # Fault injection.
        self.unavailable = 0  # answer the next N requests with 503
        self.fail_load: tuple[int, str] | None = None
        self.fail_completion_for: set[str] = set()
        # Adapters that answer exactly like the base model (zero lora_B).
        self.no_effect: set[str] = set()
        # Answer like the base model once, then through the adapter (a transient).
        self.no_effect_once: set[str] = set()
        # GET /metrics body (Prometheus text); None answers 404 like a server without it.
        self.metrics_text: str | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def restart(self) -> None:
        """vLLM keeps nothing across a restart."""
        self.adapters.clear()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body, text=False):
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind="BadRequestError"):
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def do_GET(self):
                self._route("GET", {})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._route("POST", body)

            def _route(self, method, body):
                fake.requests.append((method, self.path, body))
                if fake.unavailable > 0:
                    fake.unavailable -= 1
                    return self._error(503, "Service Unavailable", "ServiceUnavailableError")
                if method == "GET" and self.path == "/version":
                    return self._send(200, {"version": fake.version})
                if method == "GET" and self.path == "/health":
                    return self._send(200, "", text=True)
                if method == "GET" and self.path == "/metrics" and fake.metrics_text is not None:
                    return self._send(200, fake.metrics_text, text=True)
                if method == "GET" and self.path == "/v1/models":
                    cards = [{"id": fake.base_model, "root": "/models/base", "parent": None}]
                    cards += [
                        {"id": name, "root": root, "parent": fake.base_model}
                        for name, root in fake.adapters.items()
                    ]
                    return self._send(200, {"object": "list", "data": cards})
                if method == "POST" and self.path == "/v1/load_lora_adapter":
                    return self._load(body)
                if method == "POST" and self.path == "/v1/unload_lora_adapter":
                    name = body.get("lora_name")
                    if name not in fake.adapters:
                        return self._error(
                            404, f"The lora adapter '{name}' cannot be found.", "NotFoundError"
                        )
                    del fake.adapters[name]
                    return self._send(
                        200, f"Success: LoRA adapter '{name}' removed successfully.", True
                    )
                if method == "POST" and self.path in ("/v1/completions", "/v1/chat/completions"):
                    model = body.get("model")
                    if model != fake.base_model and model not in fake.adapters:
                        return self._error(
                            404, f"The model `{model}` does not exist.", "NotFoundError"
                        )
                    if model in fake.fail_completion_for:
                        return self._error(500, "engine error", "InternalServerError")
                    # Greedy logprobs that depend on the weights: here, on the path.
                    root = fake.adapters.get(model, "/models/base")
                    if model in fake.no_effect:
                        root = "/models/base"
                    elif model in fake.no_effect_once:
                        fake.no_effect_once.discard(model)
                        root = "/models/base"
                    seed = hashlib.sha256(root.encode()).digest()
                    count = int(body.get("max_tokens") or 1)
                    logprobs = {
                        "tokens": ["x"] * count,
                        "token_logprobs": [-seed[i] / 64 for i in range(count)],
                    }
                    return self._send(200, {"choices": [{"text": "x", "logprobs": logprobs}]})
                return self._send(404, {"detail": "Not Found"})

            def _load(self, body):
                name, path = body.get("lora_name"), body.get("lora_path")
                if fake.fail_load:
                    status, message = fake.fail_load
                    return self._error(status, message, "InternalServerError")
                if name in fake.adapters and not body.get("load_inplace"):
                    return self._error(
                        400,
                        f"The lora adapter '{name}' has already been loaded. If you want to "
                        "load the adapter in place, set 'load_inplace' to True.",
                        "InvalidUserInput",
                    )
                if not (Path(path) / "adapter_config.json").is_file():
                    return self._error(
                        404,
                        f"Loading lora {name} failed: No adapter found for <path>",
                        "NotFoundError",
                    )
                fake.adapters[name] = path
                return self._send(200, f"Success: LoRA adapter '{name}' added successfully.", True)

        return Handler
