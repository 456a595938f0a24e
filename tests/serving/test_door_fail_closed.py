"""The door fails closed and reads no stranger's body (issue 43), on a REAL
HAProxy (Debian's 2.6, its Lua) in front of a stand-in replica.

- A request is routed only when door.lua read its body to the end: its Lua
  failing (an error, its memory limit, its time limit) is a 503 of the door's
  own, each counted apart by its backend, and the replica sees nothing.
- The reader's work is bounded: 28,000 top-level keys are refused at the
  256th, a `model` that cannot be a served name is never built.
- vLLM's fields that make a replica render, compile, fetch or deserialise what
  a caller sends are refused, each by name (docs/security.md).
- One Authorization header, or a 400.
- Nothing of a body is read before the key: a stranger's request is answered
  as soon as its headers are in; one address and one key hold at most so many.

The figure (memory with 1,000 strangers' slow bodies): bench/door_memory.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.config import BODY_SECONDS, LUA_FILE
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.support.haproxy import needs_haproxy, requests_by_server, running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

KEY = "sk-legal-0123456789"
OTHER_KEY = "sk-legal-9876543210"
BASE = "tiny-llama"
ADAPTER = "legal-contracts"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table() -> DoorAccess:
    hour = int(time.time()) + 3600
    return DoorAccess(
        deployment="gw",
        keys={
            sha(KEY): CallerKey(key_id=1, department="legal", expires_at=hour),
            sha(OTHER_KEY): CallerKey(key_id=2, department="legal", expires_at=hour),
        },
        allowed=frozenset({("legal", BASE), ("legal", ADAPTER)}),
    )


@dataclass
class Door:
    door: HAProxyFrontDoor
    url: str
    replica: object
    log: Path

    def post(self, body: bytes | dict, key: str = KEY, path: str = "/v1/completions"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return requests.post(
            self.url + path,
            data=data,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            timeout=30,
        )

    def calls(self) -> int:
        return self.replica.calls.get("completions", 0)


@contextlib.contextmanager
def door_running(directory: Path, *, edit=None, **options) -> Iterator[Door]:
    """A door in front of one stand-in replica that serves ADAPTER; `edit`
    changes its rendered haproxy.cfg before it starts (a forced failure)."""
    with running_fleet(1) as fleet:
        replica = fleet.replicas[0]
        replica.adapters[ADAPTER] = f"/adapters/{ADAPTER}"
        replica.make_resident(ADAPTER)
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {ADAPTER: f"/adapters/{ADAPTER}"})],
            served=[ServedView(ADAPTER, f"/adapters/{ADAPTER}", held=False)],
        )
        front = HAProxyFrontDoor(directory, listen=f"127.0.0.1:{free_port()}", **options)
        front.write(table)
        if edit is not None:
            front.config_path.write_text(edit(front.config_path.read_text()))
        log = directory / "haproxy.log"
        with running_haproxy(front, log=log, access=access_table()):
            yield Door(front, f"http://{front.listen}", replica, log)


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[Door]:
    with door_running(tmp_path_factory.mktemp("door")) as running:
        yield running


def completion(**extra) -> dict:
    return {"model": ADAPTER, "prompt": "The contract says", "max_tokens": 1, **extra}


def answered_by(door: Door, backend: str, status: int, before: int) -> int:
    """Requests `backend` answered with `status` since `before` (HAProxy logs
    each a moment after its answer)."""
    deadline = time.monotonic() + 10
    while True:
        count = requests_by_server(door.log)[(backend, "<NOSRV>", status)] - before
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


# -- fail closed ---------------------------------------------------------------------


def test_a_body_whose_reader_runs_out_of_memory_is_a_503_never_routed(tmp_path):
    # 1 MiB of Lua memory cannot hold a body of nearly 1 MiB beside door.lua: the
    # reader fails on it. On
    # HAProxy's own, the request would go on to the base model's replicas.
    def tiny_lua_memory(config: str) -> str:
        assert "tune.lua.maxmem 256" in config
        return config.replace("tune.lua.maxmem 256", "tune.lua.maxmem 1")

    with door_running(tmp_path, edit=tiny_lua_memory) as door:
        assert door.post(completion()).status_code == 200  # a small body is read
        calls = door.calls()
        response = door.post(completion(prompt="x" * 1_040_000))
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert "ran out of memory" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        assert door.calls() == calls
        assert answered_by(door, "door_503_body_memory", 503, 0) == 1


def test_a_body_whose_reader_runs_out_of_time_is_a_503_never_routed(tmp_path):
    def no_lua_time(config: str) -> str:
        assert "tune.lua.session-timeout 2s" in config
        return config.replace("tune.lua.session-timeout 2s", "tune.lua.session-timeout 1")

    with door_running(tmp_path, edit=no_lua_time) as door:
        calls = door.calls()
        # 300,000 numbers: millions of Lua instructions, far past 1 ms.
        response = door.post(completion(prompt=[1] * 300_000))
        assert response.status_code == 503, response.text
        assert "ran out of time" in response.json()["error"]["message"]
        assert door.calls() == calls
        assert answered_by(door, "door_503_body_timeout", 503, 0) == 1


def test_a_body_reader_that_fails_is_a_503_never_routed(tmp_path):
    # A door.lua whose reader raises: any bug in it would.
    broken = tmp_path / "door.lua"
    source = LUA_FILE.read_text()
    marker = "local function inspect(txn, base)\n"
    assert marker in source
    broken.write_text(source.replace(marker, marker + '  error("forced")\n'))

    def broken_reader(config: str) -> str:
        line = f"lua-load {LUA_FILE.resolve()}"
        assert line in config
        return config.replace(line, f"lua-load {broken}")

    with door_running(tmp_path / "door", edit=broken_reader) as door:
        calls = door.calls()
        response = door.post(completion())
        assert response.status_code == 503, response.text
        assert "its body reader failed" in response.json()["error"]["message"]
        assert door.calls() == calls
        assert answered_by(door, "door_503_body_error", 503, 0) == 1


def test_28000_top_level_keys_are_refused_at_the_cap_at_once(door):
    body = completion() | {f"k{index}": 0 for index in range(28_000)}
    calls = door.calls()
    response = door.post(body)
    # The reader refuses as it counts the 257th key (door.lua), mid-scan: a
    # reader that went on through all 28,000 until Lua's session timeout would
    # have been a 503 "its body reader failed" (the test above). No wall-clock
    # bound here: the client's own encoding waits for a core in the light run.
    assert response.status_code == 400, response.text
    assert "more than 256 top-level keys" in response.json()["error"]["message"]
    assert door.calls() == calls


@pytest.mark.parametrize(
    "model",
    ["x" * 5000, "legal contracts", "-legal", "legal/contracts", "l" * 129],
)
def test_a_model_that_cannot_be_a_served_name_is_a_400(door, model):
    response = door.post(completion(model=model))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "not a served name" in error["message"]
    assert error["param"] == "model"


def test_an_empty_body_is_a_400_not_the_base_model(door):
    calls = door.calls()
    assert door.post(b"").status_code == 400
    assert door.calls() == calls


# -- vLLM's request fields -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("chat_template", "{{ 7 * 7 }}"),
        ("chat_template_kwargs", {"tokenize": True}),
        ("guided_regex", "(a+)+$"),
        ("guided_grammar", 'root ::= "a"'),
        ("guided_whitespace_pattern", "(a+)+"),
        ("structured_outputs", {"regex": "(a+)+$"}),
        ("prompt_embeds", "UEsDBA=="),
        ("logits_processors", ["os.system"]),
        ("priority", -100),
        ("request_id", "k1.v1.forged"),
    ],
)
def test_a_field_that_makes_a_replica_run_what_the_caller_sends_is_a_400_naming_it(
    door, field, value
):
    calls = door.calls()
    response = door.post(completion(**{field: value}), path="/v1/chat/completions")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert f"`{field}` is not accepted" in error["message"]
    assert error["param"] == field
    assert door.calls() == calls


def test_a_refused_field_spelled_with_escapes_is_refused_too(door):
    body = b'{"model":"legal-contracts","chat\\u005ftemplate":"x","messages":[]}'
    response = door.post(body, path="/v1/chat/completions")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "chat_template"


@pytest.mark.parametrize("part", ["image_url", "audio_url", "video_url", "input_audio", "file"])
def test_media_in_a_message_is_a_400_naming_it(door, part):
    content = [{"type": "text", "text": "what is this"}, {"type": part, part: {"url": "http://x"}}]
    body = {"model": ADAPTER, "messages": [{"role": "user", "content": content}]}
    response = door.post(body, path="/v1/chat/completions")
    assert response.status_code == 400, response.text
    assert f"`{part}` content is not accepted" in response.json()["error"]["message"]


def test_json_schemas_and_a_tool_property_named_file_get_through(door):
    schema = {"type": "object", "properties": {"file": {"type": "string"}}}
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "guided_json": schema,
        "tools": [{"type": "function", "function": {"name": "read", "parameters": schema}}],
    }
    response = door.post(body, path="/v1/chat/completions")
    assert response.status_code == 200, response.text


# -- one Authorization header --------------------------------------------------------


def raw_post(door: Door, headers: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
    host, port = door.door.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers)
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: door\r\n{head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("order", ["junk first", "valid first"])
def test_two_authorization_headers_are_a_400(door, order):
    headers = [("Authorization", "Bearer sk-junk"), ("Authorization", f"Bearer {KEY}")]
    if order == "valid first":
        headers.reverse()
    calls = door.calls()
    status, body = raw_post(door, headers, json.dumps(completion()).encode())
    assert status == 400
    assert "one Authorization header" in json.loads(body)["error"]["message"]
    assert door.calls() == calls
    # One of them alone is taken.
    assert raw_post(door, headers[-1:], json.dumps(completion()).encode())[0] in (200, 401)
    assert (
        raw_post(door, [("Authorization", f"Bearer {KEY}")], json.dumps(completion()).encode())[0]
        == 200
    )


# -- no stranger's body --------------------------------------------------------------


def send_head(door: Door, key: str = "", length: int = 900_000) -> socket.socket:
    """A POST whose headers are sent and whose body of `length` bytes is not."""
    host, port = door.door.listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    authorization = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: door\r\n{authorization}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
        + b'{"model":"legal-contracts","prompt":"'
    )
    return sock


def status_of(sock: socket.socket, seconds: float) -> int | None:
    """The status the door answers within `seconds`, or None."""
    sock.settimeout(seconds)
    try:
        answer = sock.recv(65536)
    except TimeoutError:
        return None
    return int(answer.split(b" ", 2)[1]) if answer else None


def test_a_stranger_is_answered_before_the_door_reads_the_body(door):
    # Before: the door buffered the whole body first, so this waited for 900 KB
    # that never came (30 s, then a 408), holding a megabyte meanwhile.
    sock = send_head(door)
    with sock:
        started = time.monotonic()
        assert status_of(sock, 3) == 401
        assert time.monotonic() - started < 3


def test_a_keyed_body_that_stops_short_is_a_408_after_its_time_never_routed(door):
    # 100 bytes short of its Content-Length, though what came is a whole JSON
    # object: the door reads a body whole or not at all.
    body = json.dumps(completion()).encode()
    host, port = door.door.listen.rsplit(":", 1)
    calls = door.calls()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: door\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n".encode()
            + body
        )
        started = time.monotonic()
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 408
    assert BODY_SECONDS - 1 <= time.monotonic() - started <= BODY_SECONDS + 5
    assert door.calls() == calls


def test_a_key_has_at_most_its_cap_of_requests_in_flight(tmp_path):
    with door_running(tmp_path, key_concurrency=2) as door:
        pending = [send_head(door, KEY) for _ in range(2)]
        try:
            # Both are tracked once HAProxy has read their headers.
            deadline = time.monotonic() + 10
            while (refused := door.post(completion())).status_code == 200:
                assert time.monotonic() < deadline, "the key's cap never applied"
                time.sleep(0.05)
            assert refused.status_code == 429, refused.text
            assert refused.headers["Retry-After"] == "1"
            assert "in flight" in refused.json()["error"]["message"]
            # Another key of the same department is not held back.
            assert door.post(completion(), key=OTHER_KEY).status_code == 200
        finally:
            for sock in pending:
                sock.close()
        deadline = time.monotonic() + 5
        while door.post(completion()).status_code != 200:
            assert time.monotonic() < deadline, "the key stayed over its cap"
            time.sleep(0.1)


def test_one_address_has_at_most_so_many_connections(tmp_path):
    with door_running(tmp_path, source_connections=3) as door:
        host, port = door.door.listen.rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.2)
            with pytest.raises(requests.ConnectionError):
                door.post(completion())
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while True:
            with contextlib.suppress(requests.ConnectionError):
                if door.post(completion()).status_code == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
