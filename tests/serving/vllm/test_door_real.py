"""The front door's checks against REAL vLLM 0.32 behind a real HAProxy: the
encoded, doubled and dotted paths that reach vLLM's admin endpoints when sent to
it directly are refused by the door (and the adapter stays loaded), and the
official `openai` client works through the door with a key: chat, completions,
streaming with usage, models.list(), its AuthenticationError and NotFoundError,
a body whose messages run past 64 KiB before `model`, and a chunked body.

One HAProxy serves the module; `vllm_servers` hands out the shared servers
without adapters, so each test loads the adapter it calls (`contracts`)."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.serving.vllm.conftest import SERVED_BASE, adapters_on
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import needs_haproxy, raw_request, running_haproxy
from tests.support.vllm_servers import VLLMServer, free_port

pytestmark = [
    pytest.mark.vllm,
    needs_haproxy,
]

KEY = "sk-legal-real-0123456789"
ADAPTER = "legal-contracts"


@dataclass
class RealDoor:
    door: HAProxyFrontDoor
    url: str
    path: str  # the adapter's directory

    def raw(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """The path sent byte for byte (requests would unquote `%5F`)."""
        return raw_request(self.door.listen, method, path, body, key=KEY)


def access_table(upstream_key: str = "") -> DoorAccess:
    """KEY calls Legal's adapter and the base model; the replicas take
    `upstream_key` (vLLM's --api-key), or none."""
    return DoorAccess(
        deployment="gw",
        keys={
            hashlib.sha256(KEY.encode()).hexdigest(): CallerKey(
                key_id=1, department="legal", expires_at=int(time.time()) + 3600
            )
        },
        allowed=frozenset({("legal", ADAPTER), ("legal", SERVED_BASE)}),
        upstream_key=upstream_key,
    )


@pytest.fixture(scope="module")
def real_door(vllm_pool, tmp_path_factory) -> Iterator[RealDoor]:
    # The session's shared servers: a restart keeps their ports, so the door
    # rendered here routes to them for the whole module.
    a, b = vllm_pool.servers(2)
    directory = tmp_path_factory.mktemp("door")
    path = str(write_adapter_dir(directory / "contracts-v1", AdapterSpec(seed=1)))
    table = routing_table(
        deployment="gw",
        base_model=SERVED_BASE,
        replicas=[
            ReplicaView(1, a.base_url, down=False, loaded={ADAPTER: path}),
            ReplicaView(2, b.base_url, down=False, loaded={}),
        ],
        served=[ServedView(ADAPTER, path, held=False)],
    )
    door = HAProxyFrontDoor(directory / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table)
    with running_haproxy(door, log=directory / "haproxy.log", access=access_table()):
        yield RealDoor(door, f"http://{door.listen}", path)


@pytest.fixture
def contracts(real_door, vllm_servers) -> RealDoor:
    """The adapter loaded on replica a (the one the door routes it to)."""
    with vllm_servers[0].client(timeout=60) as client:
        assert client.load_adapter(ADAPTER, real_door.path).ok
    return real_door


@pytest.fixture
def api(real_door) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_door.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


UNLOAD = json.dumps({"lora_name": ADAPTER}).encode()
LOAD = json.dumps({"lora_name": "planted", "lora_path": "/tmp"}).encode()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/unload_lora%5Fadapter", UNLOAD),
        ("POST", "/v1/unload_lora%5fadapter", UNLOAD),
        ("POST", "/v1%2Funload_lora_adapter", UNLOAD),
        ("POST", "/v1/unload_lora_adapter", UNLOAD),
        ("POST", "//v1/unload_lora_adapter", UNLOAD),
        ("POST", "/v1//unload_lora_adapter", UNLOAD),
        ("POST", "/v1/./unload_lora_adapter", UNLOAD),
        ("POST", "/v1/x/../unload_lora_adapter", UNLOAD),
        ("POST", "/v1/%75nload_lora_adapter", UNLOAD),
        ("POST", "/v1%2Fload_lora_adapter", LOAD),
        ("POST", "/v1/load_lora%5Fadapter", LOAD),
        ("GET", "/%6Detrics", b""),
        ("GET", "/metrics", b""),
        ("GET", "//metrics", b""),
        ("GET", "/v1/../metrics", b""),
    ],
)
def test_an_admin_path_in_any_spelling_is_refused_by_the_door_and_the_adapter_stays(
    contracts, vllm_servers, method, path, body
):
    status, answer = contracts.raw(method, path, body)
    assert status == 404, answer[:300]
    assert json.loads(answer)["error"]["code"] == "not_found"  # the door's, not vLLM's
    assert ADAPTER in adapters_on(vllm_servers[0])
    assert "planted" not in adapters_on(vllm_servers[0])


def test_the_same_encoded_unload_sent_to_vllm_directly_does_unload(contracts, vllm_servers):
    """What the door stops is real: vLLM decodes the path and unloads."""
    a = vllm_servers[0]
    address = a.base_url.removeprefix("http://")
    assert raw_request(address, "GET", "/%6Detrics", b"")[0] == 200
    status, _ = raw_request(address, "POST", "/v1/unload_lora%5Fadapter", UNLOAD)
    assert status == 200
    assert ADAPTER not in adapters_on(a)


def test_the_openai_client_chats_completes_and_streams_with_usage_through_the_door(contracts, api):
    chat = api.chat.completions.create(
        model=ADAPTER, messages=[{"role": "user", "content": "Hello"}], max_tokens=2
    )
    assert chat.model == ADAPTER and chat.choices[0].message.content is not None
    completion = api.completions.create(model=ADAPTER, prompt="The contract", max_tokens=2)
    assert completion.model == ADAPTER and completion.usage.completion_tokens >= 1
    chunks = list(
        api.chat.completions.create(
            model=ADAPTER,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) >= 2
    assert all(chunk.model == ADAPTER for chunk in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_models_list_is_the_caller_s_models_from_the_door(contracts, api):
    listed = api.models.list()
    assert [model.id for model in listed.data] == [ADAPTER, SERVED_BASE]
    assert all(getattr(model, "root", None) is None for model in listed.data)


def test_the_openai_client_raises_its_own_errors_for_a_bad_key_and_a_model_not_granted(
    real_door, api
):
    stranger = openai.OpenAI(base_url=real_door.url + "/v1", api_key="sk-nobody", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with pytest.raises(openai.AuthenticationError):
        stranger.completions.create(model=ADAPTER, prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="finance-invoices", prompt="x", max_tokens=1)


def test_messages_past_64_kib_before_model_reach_the_adapter(contracts, api):
    # The openai client sends `messages` before `model`. The bytes are in a
    # message's `name`, which the tiny model's chat template leaves out of the
    # prompt: the body is long, the prompt fits its short context.
    messages = [{"role": "user", "content": "Hello", "name": "n" * 70_000}]
    body = json.dumps({"messages": messages, "model": ADAPTER})
    assert body.index('"model"') > 64 * 1024
    chat = api.chat.completions.create(model=ADAPTER, messages=messages, max_tokens=1)
    assert chat.model == ADAPTER


def test_a_chunked_body_reaches_the_adapter(contracts):
    def chunks():
        yield b'{"prompt":"The contract says",'
        yield json.dumps({"model": ADAPTER})[1:-1].encode() + b',"max_tokens":1}'

    response = requests.post(
        contracts.url + "/v1/completions",
        data=chunks(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["model"] == ADAPTER


def test_two_model_keys_never_reach_vllm(contracts, vllm_servers):
    before = vllm_servers[0].log_path.stat().st_size
    body = json.dumps({"model": SERVED_BASE, "prompt": "x"})[:-1] + f', "model": "{ADAPTER}"}}'
    status, answer = contracts.raw("POST", "/v1/completions", body.encode())
    assert status == 400 and b"twice" in answer
    log = Path(vllm_servers[0].log_path).read_bytes()[before:]
    assert b"POST /v1/completions" not in log


def test_a_vllm_started_with_an_api_key_answers_a_keyed_client_through_the_door(
    tiny_model, tmp_path
):
    """The door swaps the caller's inference key for the deployment's vLLM key
    (docs/door.md): a replica that requires one answers through the door."""
    replica_key = f"vllm-{secrets.token_hex(16)}"
    server = VLLMServer(
        name="keyed",
        model_dir=tiny_model,
        served_name=SERVED_BASE,
        log_dir=tmp_path / "logs",
        api_key=replica_key,
    )
    # Generous: the machine's two cores are shared with the pool's servers.
    server.start_and_wait(timeout=300)
    try:
        # What the door must not forward: the caller's key is no key of vLLM's.
        direct = requests.post(
            server.base_url + "/v1/completions",
            json={"model": SERVED_BASE, "prompt": "x", "max_tokens": 1},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
        assert direct.status_code == 401
        table = routing_table(
            deployment="gw",
            base_model=SERVED_BASE,
            replicas=[ReplicaView(1, server.base_url, down=False, loaded={})],
            served=[],
        )
        door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
        door.write(table)
        log = tmp_path / "haproxy.log"
        with running_haproxy(door, log=log, access=access_table(upstream_key=replica_key)):
            api = openai.OpenAI(
                base_url=f"http://{door.listen}/v1", api_key=KEY, max_retries=0, timeout=120
            )
            completion = api.completions.create(
                model=SERVED_BASE, prompt="The contract", max_tokens=2
            )
            chat = api.chat.completions.create(
                model=SERVED_BASE, messages=[{"role": "user", "content": "Hello"}], max_tokens=2
            )
            # Without the push of the replicas' key, vLLM itself refuses.
            door.apply_access(access_table())
            with pytest.raises(openai.AuthenticationError) as refused:
                api.completions.create(model=SERVED_BASE, prompt="x", max_tokens=1)
        assert completion.model == SERVED_BASE and completion.usage.completion_tokens >= 1
        assert chat.choices[0].message.content is not None
        assert refused.value.body == "Unauthorized"  # vLLM's answer, not the door's
        assert replica_key not in log.read_text()
    finally:
        server.stop()


def test_the_openai_client_gets_rate_limit_error_past_a_limit_and_waits_retry_after(real_door, api):
    """Limits (docs/door.md): past its requests per minute the key gets a 429
    the client raises as RateLimitError; refused for tokens until a time, the
    client's own retry waits the door's Retry-After and then gets vLLM's answer."""
    from dataclasses import replace

    from serving.rules.quotas import Limited

    try:
        if 60 - time.time() % 60 < 15:  # the minute's count must not restart halfway
            time.sleep(60 - time.time() % 60 + 0.05)
        real_door.door.apply_access(replace(access_table(), rpm={"key:1": 2}))
        for _ in range(2):
            api.completions.create(model=SERVED_BASE, prompt="The contract", max_tokens=1)
        with pytest.raises(openai.RateLimitError) as refused:
            api.completions.create(model=SERVED_BASE, prompt="The contract", max_tokens=1)
        assert refused.value.code == "rate_limit_exceeded"
        assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"

        # Long enough that the limit is still on when the client asks, however
        # long a loaded machine takes to apply it (2.5 s once in CI).
        until = int(time.time()) + 8
        real_door.door.apply_access(
            replace(access_table(), limited={"key:1": Limited(until, "tokens_per_minute", 10)})
        )
        patient = openai.OpenAI(base_url=real_door.url + "/v1", api_key=KEY, max_retries=3)
        started = time.monotonic()
        answer = patient.completions.create(model=SERVED_BASE, prompt="The contract", max_tokens=1)
        waited = time.monotonic() - started
        assert answer.model == SERVED_BASE and answer.usage.completion_tokens == 1
        assert waited >= 1.9, waited  # one wait of Retry-After (counted: test_door_limits.py)
        assert time.time() >= until
    finally:
        real_door.door.apply_access(access_table())
