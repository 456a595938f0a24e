"""Unit tests of serving.vllm_client against an in-test HTTP mock server."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving.vllm_client import (
    VLLMClient,
    extract_error,
    is_already_loaded_error,
    is_not_found_error,
    is_route_missing_error,
    model_cards,
    parse_version,
    server_version,
    supports_load_inplace,
)


@dataclass
class Reply:
    status: int = 200
    body: str | bytes = ""
    content_type: str = "application/json"
    delay: float = 0.0


class MockVLLM:
    """Loopback HTTP server: `routes[(method, path)] = Reply`, records requests."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Reply] = {}
        self.requests: list[dict] = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                mock.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "json": json.loads(raw) if raw else None,
                    }
                )
                reply = mock.routes.get((self.command, self.path)) or Reply(
                    404, json.dumps({"detail": "Not Found"})
                )
                if reply.delay:
                    time.sleep(reply.delay)
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", reply.content_type)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = _handle
            do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def vllm_error(message: str, type_: str, code: int) -> str:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


@pytest.fixture
def mock() -> Iterator[MockVLLM]:
    server = MockVLLM()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def client(mock: MockVLLM) -> Iterator[VLLMClient]:
    # The mock answers from this process: in the light run (niced beside vLLM)
    # it may not get the CPU for seconds, and a 2 s timeout failed the call.
    with VLLMClient(mock.url, timeout=30.0) as c:
        yield c


def test_load_plain_text_200(mock: MockVLLM, client: VLLMClient) -> None:
    mock.routes[("POST", "/v1/load_lora_adapter")] = Reply(
        200, "Success: LoRA adapter 'a1' added successfully.", content_type="text/plain"
    )
    result = client.load_adapter("a1", "/data/a1/v1")
    assert result.ok and result.status_code == 200
    assert result.body == "Success: LoRA adapter 'a1' added successfully."
    assert result.error == "" and not result.transient
    assert result.method == "POST" and result.url == mock.url + "/v1/load_lora_adapter"
    assert result.duration_ms >= 0 and result.started_at.tzinfo is not None
    assert mock.requests[-1]["json"] == {"lora_name": "a1", "lora_path": "/data/a1/v1"}
    assert "authorization" not in {k.lower() for k in mock.requests[-1]["headers"]}


def test_load_inplace_flag_only_sent_when_true(mock: MockVLLM, client: VLLMClient) -> None:
    mock.routes[("POST", "/v1/load_lora_adapter")] = Reply(
        200, "Success", content_type="text/plain"
    )
    client.load_adapter("a1", "/p", load_inplace=True)
    assert mock.requests[-1]["json"] == {
        "lora_name": "a1",
        "lora_path": "/p",
        "load_inplace": True,
    }


def test_already_loaded_400(mock: MockVLLM, client: VLLMClient) -> None:
    message = (
        "The lora adapter 'a1' has already been loaded. If you want to load the adapter "
        "in place, set 'load_inplace' to True."
    )
    mock.routes[("POST", "/v1/load_lora_adapter")] = Reply(
        400, vllm_error(message, "InvalidUserInput", 400)
    )
    result = client.load_adapter("a1", "/p")
    assert not result.ok and result.status_code == 400
    assert result.error == message
    assert not result.transient
    assert is_already_loaded_error(result)
    assert not is_not_found_error(result)
    assert result.body["error"]["type"] == "InvalidUserInput"


def test_unload_unknown_404(mock: MockVLLM, client: VLLMClient) -> None:
    mock.routes[("POST", "/v1/unload_lora_adapter")] = Reply(
        404, vllm_error("The lora adapter 'zz' cannot be found.", "NotFoundError", 404)
    )
    result = client.unload_adapter("zz")
    assert result.status_code == 404 and not result.ok and not result.transient
    assert is_not_found_error(result)
    assert not is_route_missing_error(result)
    assert mock.requests[-1]["json"] == {"lora_name": "zz"}


def test_route_missing_404_detail(mock: MockVLLM, client: VLLMClient) -> None:
    # No route configured -> FastAPI-style {"detail": "Not Found"}.
    result = client.unload_adapter("a1")
    assert result.status_code == 404 and result.error == "Not Found"
    assert is_route_missing_error(result)
    assert not is_not_found_error(result)
    assert not result.transient


def test_500_validation_error_is_permanent(mock: MockVLLM, client: VLLMClient) -> None:
    message = "Loading lora big failed: LoRA rank 64 is greater than max_lora_rank 16."
    mock.routes[("POST", "/v1/load_lora_adapter")] = Reply(
        500, vllm_error(message, "InternalServerError", 500)
    )
    result = client.load_adapter("big", "/p")
    assert result.status_code == 500 and not result.ok
    assert result.error == message
    assert result.transient is False


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_and_unavailable_are_transient(
    mock: MockVLLM, client: VLLMClient, status: int
) -> None:
    mock.routes[("GET", "/health")] = Reply(
        status, "Service Unavailable", content_type="text/plain"
    )
    result = client.health()
    assert result.status_code == status and not result.ok
    assert result.transient is True
    assert result.error == "Service Unavailable"


def test_connection_refused_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nobody listens on `port` any more.
    with VLLMClient(f"http://127.0.0.1:{port}", connect_timeout=1.0) as c:
        result = c.health()
    assert result.status_code is None and not result.ok
    assert result.transient is True
    assert result.error.startswith("connection error")
    assert result.body is None


def test_timeout_is_transient(mock: MockVLLM) -> None:
    # The reply comes far later than the timeout, so the bound below holds on a
    # loaded machine too (a 1 s reply once took 1,058 ms to time out at 0.2 s;
    # the light run is niced beside vLLM): 10 s, against a reply at 20 s.
    mock.routes[("GET", "/v1/models")] = Reply(200, json.dumps({"data": []}), delay=20.0)
    with VLLMClient(mock.url, timeout=0.2) as c:
        result = c.list_models()
    assert result.status_code is None and not result.ok
    assert result.transient is True
    assert result.error.startswith("timeout")
    assert result.duration_ms < 10_000


def test_api_key_header_sent_and_never_logged(
    mock: MockVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-key-value"
    mock.routes[("GET", "/v1/models")] = Reply(200, json.dumps({"object": "list", "data": []}))
    caplog.set_level(logging.DEBUG, logger="serving.vllm_client")
    with VLLMClient(mock.url + "/v1/", api_key=secret) as c:
        result = c.list_models()
        assert secret not in repr(c)
    assert result.ok
    assert mock.requests[-1]["path"] == "/v1/models"
    headers = {k.lower(): v for k, v in mock.requests[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {secret}"
    assert secret not in caplog.text
    assert secret not in json.dumps(result.as_dict())


def test_list_models_cards(mock: MockVLLM, client: VLLMClient) -> None:
    mock.routes[("GET", "/v1/models")] = Reply(
        200,
        json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": "tiny-llama", "root": "/models/tiny", "parent": None},
                    {"id": "a1", "root": "/data/a1/v1", "parent": "tiny-llama"},
                ],
            }
        ),
    )
    cards = model_cards(client.list_models())
    assert [(c.id, c.root, c.parent, c.is_adapter) for c in cards] == [
        ("tiny-llama", "/models/tiny", None, False),
        ("a1", "/data/a1/v1", "tiny-llama", True),
    ]


def test_version_and_complete_one_token(mock: MockVLLM, client: VLLMClient) -> None:
    mock.routes[("GET", "/version")] = Reply(200, json.dumps({"version": "0.32.0"}))
    mock.routes[("POST", "/v1/chat/completions")] = Reply(
        200, json.dumps({"choices": [{"index": 0}]})
    )
    mock.routes[("POST", "/v1/completions")] = Reply(200, json.dumps({"choices": [{"text": "x"}]}))
    assert server_version(client.version()) == "0.32.0"
    assert client.complete_one_token("a1").ok
    sent = mock.requests[-1]["json"]
    assert sent["model"] == "a1" and sent["max_tokens"] == 1 and sent["temperature"] == 0
    assert sent["messages"][0]["role"] == "user"
    assert client.complete_one_token("a1", chat=False, prompt="Hi").ok
    assert mock.requests[-1]["path"] == "/v1/completions"
    assert mock.requests[-1]["json"]["prompt"] == "Hi"


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.32.0", False),
        ("0.32.9", False),
        ("0.33.0", True),
        ("0.33.0rc1", True),
        ("0.34.1.dev3+gabc.cpu", True),
        ("1.0.0", True),
        ("0.9.2", False),
        ("", False),
        (None, False),
        ("garbage", False),
    ],
)
def test_supports_load_inplace(version: str | None, expected: bool) -> None:
    assert supports_load_inplace(version) is expected


def test_parse_version_and_extract_error() -> None:
    assert parse_version("v0.33.1+cpu").release == (0, 33, 1)
    assert parse_version("not a version") is None
    assert extract_error({"detail": [{"msg": "field required"}]}, "") == "field required"
    assert extract_error({"error": "boom"}, "") == "boom"
    assert (
        extract_error("Internal Server Error", "Internal Server Error\n") == "Internal Server Error"
    )


class EndlessBody:
    """Whatever answers at a replica's address: 200, then bytes forever (no
    Content-Length). Counts what it managed to send."""

    def __init__(self) -> None:
        self.sent = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._sock.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
        chunk = b'"x",' * 65536
        try:
            while self.sent < 2 * 1024**3:
                conn.sendall(chunk)
                self.sent += len(chunk)
        except OSError:
            pass  # the client hung up: what we want
        finally:
            conn.close()
            self._sock.close()


def test_a_body_past_the_cap_is_refused_without_reading_the_rest() -> None:
    server = EndlessBody()
    with VLLMClient(server.url, timeout=5.0, max_response_bytes=4 * 1024**2) as c:
        started = time.monotonic()
        result = c.list_models()
    assert not result.ok and result.transient is False
    assert result.error == f"response body larger than {4 * 1024**2} bytes"
    assert result.body is None
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert server.sent < 64 * 1024**2, server.sent  # not 2 GiB: the client stopped reading


def test_the_default_cap_is_far_above_what_vllm_answers(mock: MockVLLM) -> None:
    cards = [{"id": f"adapter-{n}", "object": "model", "root": "/x"} for n in range(5000)]
    mock.routes[("GET", "/v1/models")] = Reply(200, json.dumps({"object": "list", "data": cards}))
    with VLLMClient(mock.url) as c:
        result = c.list_models()
    assert result.ok and len(result.body["data"]) == 5000
