"""A reverse proxy in front of ONE real vLLM server, for faults that real vLLM
cannot be made to produce on demand, and to count what reaches a replica.

Everything is forwarded unchanged, except completions for a model named in
`fail_completions_for`: those are answered with a 500 in vLLM's own JSON error
format, as an engine crash on that replica would be. An unreachable upstream
is a 502, as from a real proxy (the control plane treats it as transient).

A slow and lossy network (the fault suite): `latency_seconds` holds every
request (or only those whose path starts with a key of `latency_by_path`)
before forwarding it, and `drop_every = N` closes every Nth connection's
request without an answer, as a flaky link or a restarting load balancer
does. `fail_paths = {"/v1/load_lora_adapter": 503}` answers that status
instead of forwarding. `go_down()` stops listening (clients see "connection refused", the
replica is gone); `come_up()` listens again on the same port.

    with FaultProxy(server.base_url) as proxy:
        proxy.fail_completions_for.add("legal-contracts")
        proxy.requests            # [(method, path), ...] seen so far
        proxy.latency_seconds = 0.3; proxy.drop_every = 2
        proxy.go_down(); proxy.come_up()
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own business.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}


class FaultProxy:
    def __init__(self, upstream: str, *, timeout: float = 120.0) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.timeout = timeout
        self.fail_completions_for: set[str] = set()
        # Only the control plane's probes (completions asking for logprobs) fail:
        # clients' completions through the same replica still go through.
        self.fail_probes_only = False
        self.fault_message = "Injected fault: the engine failed to run this adapter."
        self.requests: list[tuple[str, str]] = []
        self.faults_served = 0
        self.latency_seconds = 0.0
        self.latency_by_path: dict[str, float] = {}
        self.drop_every = 0
        self.dropped = 0
        # path prefix -> HTTP status answered instead of forwarding (503: a replica
        # that is up but refusing work for a while, e.g. still warming up).
        self.fail_paths: dict[str, int] = {}
        # A broken version: once an adapter is loaded through this proxy from a
        # folder named here, clients' completions for it get a 500 (the control
        # plane's probes still pass), until it is loaded from another folder.
        self.broken_roots: set[str] = set()
        self._roots: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0
        self.come_up()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._server is not None

    def come_up(self) -> None:
        """Listens (again, on the same port after go_down)."""
        if self._server is not None:
            return
        server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def go_down(self) -> None:
        """Stops listening: new connections are refused until come_up()."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def close(self) -> None:
        self.go_down()

    def _delay_for(self, path: str) -> float:
        for prefix, seconds in self.latency_by_path.items():
            if path.startswith(prefix):
                return seconds
        return self.latency_seconds

    def _should_drop(self) -> bool:
        with self._lock:
            if self.drop_every and len(self.requests) % self.drop_every == 0:
                self.dropped += 1
                return True
        return False

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _should_fail(self, method: str, path: str, body: bytes) -> bool:
        if method != "POST" or path.split("?", 1)[0] not in COMPLETION_PATHS:
            return False
        try:
            request = json.loads(body or b"{}")
            model = request.get("model")
        except (ValueError, AttributeError):
            return False
        if self.fail_probes_only and "logprobs" not in request:
            return False
        if self._roots.get(model) in self.broken_roots and "logprobs" not in request:
            return True
        return model in self.fail_completions_for

    def _note_load(self, path: str, body: bytes) -> None:
        if path.split("?", 1)[0] != "/v1/load_lora_adapter":
            return
        try:
            request = json.loads(body or b"{}")
            self._roots[request["lora_name"]] = request["lora_path"]
        except (ValueError, KeyError, TypeError):
            return

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json_error(self, status: int, message: str, kind: str) -> None:
                body = json.dumps(
                    {"error": {"message": message, "type": kind, "param": None, "code": status}}
                ).encode()
                self._reply(status, body, [("Content-Type", "application/json")])

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                delay = proxy._delay_for(self.path)
                if delay:
                    time.sleep(delay)
                if proxy._should_drop():
                    # No answer at all: the client sees the connection closed under it.
                    self.close_connection = True
                    return
                failing = [c for p, c in proxy.fail_paths.items() if self.path.startswith(p)]
                if failing:
                    self._json_error(failing[0], "Injected fault: try again.", "Unavailable")
                    return
                proxy._note_load(self.path, body)
                if proxy._should_fail(self.command, self.path, body):
                    with proxy._lock:
                        proxy.faults_served += 1
                    self._json_error(500, proxy.fault_message, "InternalServerError")
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                connection = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=proxy.timeout
                )
                try:
                    connection.request(self.command, self.path, body=body or None, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                    self._reply(response.status, data, response.getheaders())
                except OSError as error:
                    self._json_error(502, f"Upstream unreachable: {error}", "BadGateway")
                finally:
                    connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
