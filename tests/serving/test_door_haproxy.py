"""The front door's checks, on a REAL HAProxy (Debian's 2.6, with its Lua) in
front of stand-in replicas: keys, grants, the door's own /v1/models, the path
allow-list and strict bodies. One HAProxy serves the module; a test that
changes the access table puts the module's table back.

The same attacks against real vLLM behind the door: tests/serving/vllm/test_door_real.py."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.config import render_config
from serving.door.haproxy.front_door import GLIBC_TUNABLES
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.support.haproxy import (
    needs_haproxy,
    raw_request,
    requests_by_server,
    running_haproxy,
)
from tests.support.prometheus_server import PrometheusServer, ScrapeJob, prometheus_available
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

LEGAL_KEY = "sk-legal-0123456789"
FINANCE_KEY = "sk-finance-0123456789"
EXPIRED_KEY = "sk-expired-0123456789"
BASE = "tiny-llama"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table() -> DoorAccess:
    hour = int(time.time()) + 3600
    return DoorAccess(
        deployment="gw",
        keys={
            sha(LEGAL_KEY): CallerKey(key_id=1, department="legal", expires_at=hour),
            sha(FINANCE_KEY): CallerKey(key_id=2, department="finance", expires_at=hour),
            sha(EXPIRED_KEY): CallerKey(key_id=3, department="legal", expires_at=hour - 7200),
        },
        allowed=frozenset(
            {
                ("legal", BASE),
                ("legal", "legal-contracts"),
                ("finance", BASE),
                ("finance", "finance-invoices"),
            }
        ),
    )


@dataclass
class Door:
    door: HAProxyFrontDoor
    url: str
    replica: object
    log: Path

    def post(self, path: str, body=None, *, key: str | None = LEGAL_KEY, data=None, headers=None):
        sent = dict(headers or {})
        if key:
            sent["Authorization"] = f"Bearer {key}"
        return requests.post(self.url + path, json=body, data=data, headers=sent, timeout=30)

    def raw(self, method: str, path: str, body: bytes = b"", key: str = LEGAL_KEY):
        return raw_request(self.door.listen, method, path, body, key=key)


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[Door]:
    directory = tmp_path_factory.mktemp("door")
    with running_fleet(1) as fleet:
        replica = fleet.replicas[0]
        for name in ("legal-contracts", "finance-invoices"):
            replica.adapters[name] = f"/adapters/{name}"
            replica.make_resident(name)  # no files to read: never cold
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[
                ReplicaView(
                    1,
                    fleet.urls[0],
                    False,
                    {n: f"/adapters/{n}" for n in ("legal-contracts", "finance-invoices")},
                )
            ],
            served=[
                ServedView("legal-contracts", "/adapters/legal-contracts", held=False),
                ServedView("finance-invoices", "/adapters/finance-invoices", held=False),
            ],
        )
        front = HAProxyFrontDoor(
            directory,
            listen=f"127.0.0.1:{free_port()}",
            metrics=f"127.0.0.1:{free_port()}",
        )
        front.write(table)
        with running_haproxy(front, log=directory / "haproxy.log", access=access_table()):
            yield Door(front, f"http://{front.listen}", replica, directory / "haproxy.log")


@pytest.fixture
def restore_access(door):
    yield
    door.door.apply_access(access_table())


def completion(model) -> dict:
    return {"model": model, "prompt": "The contract says", "max_tokens": 1}


# -- keys -----------------------------------------------------------------------------


def test_a_request_without_a_key_gets_a_401_in_openai_s_error_shape(door):
    response = door.post("/v1/completions", completion("legal-contracts"), key=None)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("key", ["sk-nobody-knows", LEGAL_KEY.upper(), f"{LEGAL_KEY} extra"])
def test_a_key_the_door_does_not_know_gets_a_401(door, key):
    assert door.post("/v1/completions", completion("legal-contracts"), key=key).status_code == 401


def test_an_expired_key_is_refused_by_the_door_itself(door):
    response = door.post("/v1/completions", completion("legal-contracts"), key=EXPIRED_KEY)
    assert response.status_code == 401
    assert "expired" in response.json()["error"]["message"]


def test_a_key_calls_its_department_s_adapter_and_the_base_model(door):
    for model in ("legal-contracts", BASE):
        response = door.post("/v1/completions", completion(model))
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model


def test_the_bearer_scheme_is_case_insensitive(door):
    response = door.post(
        "/v1/completions",
        completion("legal-contracts"),
        key=None,
        headers={"Authorization": f"bearer {LEGAL_KEY}"},
    )
    assert response.status_code == 200


def test_a_revoked_key_is_refused_at_once_without_a_reload(door, restore_access):
    worker = door.door.runtime.worker_pid()
    table = access_table()
    keys = {h: k for h, k in table.keys.items() if h != sha(LEGAL_KEY)}
    changes = door.door.apply_access(replace(table, keys=keys))
    assert changes and all("keys.map" in c or "door.map" in c for c in changes)
    assert door.post("/v1/completions", completion("legal-contracts")).status_code == 401
    assert door.door.runtime.worker_pid() == worker
    assert sha(LEGAL_KEY) not in (door.door.directory / "keys.map").read_text()


def test_an_access_table_pushed_again_unchanged_costs_one_read_and_changes_nothing(door):
    assert door.door.apply_access(access_table()) == []


def test_an_open_door_takes_requests_without_a_key(door, restore_access):
    door.door.apply_access(DoorAccess(deployment="gw", open=True))
    response = door.post("/v1/completions", completion("finance-invoices"), key=None)
    assert response.status_code == 200
    assert response.json()["model"] == "finance-invoices"


def test_the_door_starts_closed_before_it_is_given_an_access_table(tmp_path):
    front = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    front.write(routing_table(deployment="gw", base_model=BASE, replicas=[], served=[]))
    with running_haproxy(front, log=tmp_path / "haproxy.log"):
        response = requests.post(
            f"http://{front.listen}/v1/completions", json=completion(BASE), timeout=10
        )
    assert response.status_code == 401


# -- grants -----------------------------------------------------------------------------


def test_another_department_s_adapter_gets_the_same_404_as_one_that_does_not_exist(door):
    calls = door.replica.calls.get("completions:finance-invoices", 0)
    not_granted = door.post("/v1/completions", completion("finance-invoices"))
    missing = door.post("/v1/completions", completion("finance-nothing"))
    assert not_granted.status_code == missing.status_code == 404
    assert not_granted.json()["error"] == {
        **missing.json()["error"],
        "message": "The model `finance-invoices` does not exist.",
    }
    assert door.replica.calls.get("completions:finance-invoices", 0) == calls


def test_a_grant_pushed_at_runtime_lets_the_caller_in(door, restore_access):
    table = access_table()
    door.door.apply_access(replace(table, allowed=table.allowed | {("legal", "finance-invoices")}))
    assert door.post("/v1/completions", completion("finance-invoices")).status_code == 200


def test_a_grant_ends_at_the_door_at_its_end_without_a_push(door, restore_access):
    # Its end is in grants.map, compared with HAProxy's clock: before, an expired
    # grant worked until the next sync took it out (and a broker down kept it).
    table = access_table()
    ends = int(time.time()) + 2
    door.door.apply_access(
        replace(
            table,
            allowed=table.allowed | {("legal", "finance-invoices")},
            grant_ends={("legal", "finance-invoices"): ends},
        )
    )
    fingerprint = door.door.runtime.map_entries(door.door.directory.resolve() / "door.map")
    assert door.post("/v1/completions", completion("finance-invoices")).status_code == 200
    while (
        answer := door.post("/v1/completions", completion("finance-invoices"))
    ).status_code == 200:
        assert time.time() < ends + 1.5, "the grant outlived its end"
        time.sleep(0.05)
    assert answer.status_code == 404
    assert time.time() >= ends - 0.05
    assert door.door.runtime.map_entries(door.door.directory.resolve() / "door.map") == fingerprint
    # The department's own adapter needs no grant and has no end.
    assert door.post("/v1/completions", completion("legal-contracts")).status_code == 200


# -- /v1/models ---------------------------------------------------------------------------


def test_v1_models_lists_exactly_the_caller_s_models_without_paths_the_same_every_time(door):
    bodies = [
        requests.get(
            door.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        for key in (LEGAL_KEY, LEGAL_KEY, FINANCE_KEY)
    ]
    assert [b.status_code for b in bodies] == [200, 200, 200]
    assert bodies[0].content == bodies[1].content
    legal, finance = bodies[0].json(), bodies[2].json()
    assert legal["object"] == "list"
    assert [m["id"] for m in legal["data"]] == ["legal-contracts", BASE]
    assert [m["id"] for m in finance["data"]] == ["finance-invoices", BASE]
    assert all(set(m) == {"id", "object", "created", "owned_by"} for m in legal["data"])
    assert door.replica.calls.get("models", 0) == 0  # answered by the door


def test_v1_models_needs_a_key(door):
    assert requests.get(door.url + "/v1/models", timeout=10).status_code == 401


# -- paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/v1/unload_lora%5Fadapter"),
        ("POST", "/v1%2Fload_lora_adapter"),
        ("POST", "/v1/load_lora%5fadapter"),
        ("GET", "/metrics"),
        ("GET", "/%6Detrics"),
        ("GET", "/v1/../metrics"),
        ("POST", "//v1/unload_lora_adapter"),
        ("POST", "/v1//completions"),
        ("POST", "/v1/./completions"),
        ("POST", "/v1/x/../completions"),
        ("POST", "/v1/%63ompletions"),
        ("POST", "/tokenize"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/completions"),
        ("POST", "/v1/models"),
        ("DELETE", "/v1/models"),
        ("POST", "http://evil/v1/completions"),
    ],
)
def test_a_path_off_the_client_list_gets_the_door_s_404(door, method, path):
    body = json.dumps(completion("legal-contracts")).encode()
    status, answer = door.raw(method, path, body)
    assert status == 404
    assert json.loads(answer)["error"]["code"] == "not_found"


def test_the_client_paths_get_through(door):
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = completion("legal-contracts") | {"messages": [{"role": "user", "content": "hi"}]}
        status, _ = door.raw("POST", path, json.dumps(body).encode())
        assert status == 200, path


# -- bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"model":"legal-contracts","model":"finance-invoices"}', "the key `model` twice"),
        (b'{"model":"legal-contracts","mod\\u0065l":"finance-invoices"}', "`model` twice"),
        (b'{"model":1}', "`model` must be a string, not a number"),
        (b'{"model":["legal-contracts"]}', "`model` must be a string, not an array"),
        (b'{"model":null}', "`model` must be a string, not null"),
        (b'{"model":"legal-contracts","temperature":NaN}', "not valid JSON"),
        (b'{"model":"legal-contracts","temperature":Infinity}', "not valid JSON"),
        (b'\xef\xbb\xbf{"model":"legal-contracts"}', "not a JSON object"),
        (b'{"model":"legal-contracts"} {}', "bytes after its JSON object"),
        (b'{"model":"legal-contracts",}', "not valid JSON"),
        (b'{"model":"legal-contracts"', "ends inside a JSON value"),
        (b'{"model":"legal-\xff"}', "not valid UTF-8"),
        (b'{"model":"legal-contracts","prompt":"a\x01b"}', "control character"),
        (b'{"model":"legal\\ud800"}', "invalid \\u escape"),
        (b'{"model":"legal-contracts","prompt":"\\x41"}', "an invalid escape"),
        (b"[1]", "not a JSON object"),
        (b'{"a":' + b"[" * 200 + b"]" * 200 + b"}", "nests deeper than 128"),
    ],
)
def test_a_body_two_parsers_could_read_two_ways_gets_a_400_naming_the_problem(door, body, problem):
    response = door.post("/v1/completions", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert problem in error["message"]
    assert error["code"] == 400


def test_a_model_with_escapes_is_decoded_as_vllm_decodes_it(door):
    body = b'{"mod\\u0065l":"legal\\u002dcontracts","prompt":"x","max_tokens":1}'
    response = door.post("/v1/completions", data=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "legal-contracts"


def test_a_body_without_model_goes_to_the_base_model_as_vllm_serves_it(door):
    before = requests_by_server(door.log)[("base", "r1", 404)]
    # The stand-in answers a missing model 404; vLLM serves its first name.
    door.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
    deadline = time.monotonic() + 5
    while requests_by_server(door.log)[("base", "r1", 404)] == before:
        assert time.monotonic() < deadline, "not routed to the base model's backend"
        time.sleep(0.05)


def test_messages_past_64_kib_before_model_are_read_to_the_model(door):
    body = {
        "messages": [{"role": "user", "content": "word " * 20_000}],
        "model": "legal-contracts",
        "max_tokens": 1,
    }
    response = door.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "legal-contracts"


def test_a_chunked_body_is_read_whole(door):
    def chunks():
        yield b'{"messages":[{"role":"user","content":"' + b"x" * 100_000 + b'"}],'
        yield b'"model":"legal-contracts","max_tokens":1}'

    response = door.post("/v1/chat/completions", data=chunks())
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "legal-contracts"


def test_a_body_over_the_limit_gets_a_413_saying_the_limit(door):
    body = {"model": "legal-contracts", "prompt": "x" * (1024 * 1024)}
    response = door.post("/v1/completions", body)
    assert response.status_code == 413
    assert "1048576 bytes" in response.json()["error"]["message"]


def test_a_chunked_body_over_the_limit_gets_a_413(door):
    def chunks():
        for _ in range(40):
            yield b"x" * 50_000

    assert door.post("/v1/completions", data=chunks()).status_code == 413


def test_headers_that_leave_no_room_for_the_body_get_a_431_not_a_half_read_body(door):
    # A body under the limit behind 70 KB of headers: HAProxy's buffer (the
    # limit plus 64 KiB) fills before the body ends, and the door read half a
    # body ("an unterminated string", 400). Headers past the door's own limit
    # are refused first, so every body under the limit is read whole.
    body = {"model": "legal-contracts", "prompt": "x" * (1024 * 1024 - 1000), "max_tokens": 1}
    response = door.post("/v1/completions", body, headers={"X-Padding": "y" * 70_000})
    assert response.status_code == 431, response.text
    assert "32768 bytes" in response.json()["error"]["message"]


def test_a_long_query_string_counts_with_the_headers(door):
    body = {"model": "legal-contracts", "prompt": "x" * (1024 * 1024 - 1000), "max_tokens": 1}
    response = door.post("/v1/completions?q=" + "z" * 70_000, body)
    assert response.status_code == 431, response.text


def test_headers_under_the_limit_beside_a_body_of_the_limit_get_through(door):
    # 7 KB: the stand-in replica (http.server) takes at most 8 KiB of headers.
    body = {"model": "legal-contracts", "prompt": "x" * (1024 * 1024 - 1000), "max_tokens": 1}
    response = door.post("/v1/completions", body, headers={"X-Padding": "y" * 7_000})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "legal-contracts"


# -- the admin surface ----------------------------------------------------------------------


def test_the_runtime_api_is_a_unix_socket_only(tmp_path):
    config = render_config(
        routing_table(deployment="gw", base_model=BASE, replicas=[], served=[]),
        tmp_path,
        listen="0.0.0.0:8080",
    )
    (socket_line,) = [line for line in config.splitlines() if "stats socket" in line]
    assert f"stats socket {tmp_path.resolve()}/admin.sock mode 600 level admin" in socket_line
    assert "ipv4@" not in config and "ipv6@" not in config
    front = HAProxyFrontDoor(tmp_path, listen="0.0.0.0:8080")
    master = front.command_line()[front.command_line().index("-S") + 1]
    assert master == f"{tmp_path.resolve()}/master.sock,mode,600"


def test_the_bench_s_door_without_metering_stamps_no_ids_and_counts_no_limits(tmp_path):
    """bench/door_overhead.py's baseline; the product's door has both."""
    table = routing_table(deployment="gw", base_model=BASE, replicas=[], served=[])
    product = render_config(table, tmp_path, listen="127.0.0.1:8080")
    bare = render_config(table, tmp_path, listen="127.0.0.1:8080", metering=False)
    for config, present in ((product, True), (bare, False)):
        assert ("set-header x-request-id" in config) is present
        assert ("track-sc1" in config and "limited.map" in config) is present
    assert HAProxyFrontDoor(tmp_path, listen="127.0.0.1:8080").metering is True


def test_haproxy_holds_no_environment_of_the_process_that_starts_it(door):
    shown = door.door.runtime.command("show env").split()
    # HAProxy adds its own (HAPROXY_*); nothing else of the caller's survives.
    assert [line for line in shown if not line.startswith("HAPROXY_")] == [
        "PATH=/usr/sbin:/usr/bin:/bin",
        GLIBC_TUNABLES,
        # The configuration's own `setenv`: where door.lua finds held.map.
        f"DOOR_HELD_MAP={door.door.held_map_path}",
    ]


# -- observable -------------------------------------------------------------------------


@pytest.mark.skipif(not prometheus_available(), reason="prometheus is not installed")
def test_prometheus_scrapes_the_door_s_counts_per_model_and_per_refusal(door, tmp_path):
    for _ in range(3):
        door.post("/v1/completions", completion("legal-contracts"), key="sk-wrong")
    door.post("/v1/completions", completion("legal-contracts"), key=EXPIRED_KEY)
    door.raw("POST", "/v1/unload_lora%5Fadapter")
    door.post("/v1/completions", completion("finance-invoices"))
    door.post("/v1/completions", data=b'{"model":1}')
    for _ in range(2):
        assert door.post("/v1/completions", completion("legal-contracts")).status_code == 200
    job = ScrapeJob("door", [f"http://{door.door.metrics}"])
    with PrometheusServer([job], tmp_path) as prometheus:

        def responses(proxy: str, code: str) -> str:
            return f'haproxy_backend_http_responses_total{{proxy="{proxy}",code="{code}"}}'

        at_least = {
            responses("door_401_key", "4xx"): 3,
            responses("door_401_expired", "4xx"): 1,
            responses("door_404_path", "4xx"): 1,
            responses("not_found", "4xx"): 1,
            responses("door_400_body", "4xx"): 1,
            responses("m_legal-contracts", "2xx"): 2,
            'haproxy_backend_http_requests_total{proxy="m_legal-contracts"}': 2,
        }
        for promql, count in at_least.items():
            prometheus.wait_for(promql, lambda v, c=count: v is not None and v >= c)
        assert (
            prometheus.value(
                'haproxy_backend_response_time_average_seconds{proxy="m_legal-contracts"}'
            )
            is not None
        )
    # The exporter is on its own listener, never on the clients' port.
    assert door.raw("GET", "/metrics")[0] == 404


# -- the replicas' own key ------------------------------------------------------------------

REPLICA_KEY = "vllm-replica-key-0123456789"


@pytest.fixture
def keyed_door(tmp_path) -> Iterator[Door]:
    """A door in front of a replica that requires an API key (vLLM's --api-key),
    given the module's access table and that key."""
    with running_fleet(1, api_key=REPLICA_KEY) as fleet:
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        front = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
        front.write(table)
        access = replace(access_table(), upstream_key=REPLICA_KEY)
        with running_haproxy(front, log=tmp_path / "haproxy.log", access=access):
            yield Door(front, f"http://{front.listen}", fleet.replicas[0], tmp_path / "haproxy.log")


def test_the_door_sends_the_replicas_their_key_in_place_of_the_caller_s(keyed_door):
    response = keyed_door.post("/v1/completions", completion(BASE))
    assert response.status_code == 200, response.text
    assert keyed_door.replica.calls.get("unauthorized", 0) == 0
    # The caller's inference key alone is what vLLM refuses.
    direct = requests.post(
        keyed_door.replica.base_url + "/v1/completions",
        json=completion(BASE),
        headers={"Authorization": f"Bearer {LEGAL_KEY}"},
        timeout=10,
    )
    assert direct.status_code == 401


def test_a_door_without_the_replicas_key_gets_their_401(keyed_door, restore_access):
    keyed_door.door.apply_access(access_table())  # no upstream key
    response = keyed_door.post("/v1/completions", completion(BASE))
    assert response.status_code == 401
    assert response.json() == {"error": "Unauthorized"}  # vLLM's, not the door's
    assert keyed_door.replica.calls["unauthorized"] == 1


def test_a_new_replica_key_is_sent_from_the_next_request_without_a_reload(keyed_door):
    worker = keyed_door.door.runtime.worker_pid()
    keyed_door.replica.api_key = "vllm-rotated-key-9876543210"
    assert keyed_door.post("/v1/completions", completion(BASE)).status_code == 401
    changes = keyed_door.door.apply_access(
        replace(access_table(), upstream_key="vllm-rotated-key-9876543210")
    )
    assert any("upstream.map" in change for change in changes)
    assert not any("vllm-rotated" in change for change in changes)
    assert keyed_door.post("/v1/completions", completion(BASE)).status_code == 200
    assert keyed_door.door.runtime.worker_pid() == worker


def test_the_replicas_key_is_only_in_a_map_file_of_mode_600(keyed_door):
    assert keyed_door.post("/v1/completions", completion(BASE)).status_code == 200
    directory = keyed_door.door.directory
    upstream = directory / "upstream.map"
    assert upstream.stat().st_mode & 0o777 == 0o600
    assert all(
        (directory / f"{name}.map").stat().st_mode & 0o777 == 0o600 for name in ("keys", "door")
    )
    encoded = base64.b64encode(REPLICA_KEY.encode()).decode()
    assert encoded in upstream.read_text()
    for path in directory.iterdir():
        if path.is_file() and path.name != "upstream.map":
            text = path.read_text(errors="replace")
            assert REPLICA_KEY not in text and encoded not in text, path.name
    deadline = time.monotonic() + 5
    while " 200 " not in (log := keyed_door.log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # HAProxy writes its request's line a moment after the answer
    assert " 200 " in log and REPLICA_KEY not in log and encoded not in log
    assert REPLICA_KEY not in keyed_door.door.runtime.command("show env")
    assert REPLICA_KEY not in repr(replace(access_table(), upstream_key=REPLICA_KEY))


def test_a_refused_push_of_the_replicas_key_does_not_quote_it(tmp_path, monkeypatch):
    from serving.door.haproxy import DoorError
    from serving.door.haproxy.runtime import RuntimeAPI

    front = HAProxyFrontDoor(tmp_path, listen="127.0.0.1:1")
    monkeypatch.setattr(RuntimeAPI, "available", lambda api: True)
    monkeypatch.setattr(RuntimeAPI, "map_entries", lambda api, path: {})

    def refuse(api, lines, batch=200):
        if lines and "upstream.map" in lines[0]:
            raise DoorError(f"HAProxy refused {lines[0]!r}: error")

    monkeypatch.setattr(RuntimeAPI, "commands", refuse)
    encoded = base64.b64encode(REPLICA_KEY.encode()).decode()
    with pytest.raises(DoorError) as refused:
        front.apply_access(replace(access_table(), upstream_key=REPLICA_KEY))
    assert "upstream.map" in str(refused.value)
    assert encoded not in str(refused.value) and refused.value.__cause__ is None
    assert refused.value.__suppress_context__


def test_a_door_with_a_low_file_limit_asks_for_no_more_and_starts(tmp_path, monkeypatch):
    """A container with nofile 1024:1024 (podman's, in the compose tier): the
    door asked HAProxy for 768 connections, HAProxy could not raise its file
    limit to about 3,100 and refused to start, so the stack had no door."""
    import subprocess

    from serving.door.haproxy import config as haproxy

    monkeypatch.setattr(haproxy.resource, "getrlimit", lambda kind: (1024, 1024))
    assert haproxy.connection_limit() < haproxy.MAX_CONNECTIONS
    port = free_port()
    front = HAProxyFrontDoor(tmp_path, listen=f"127.0.0.1:{port}")
    front.write(routing_table(deployment="gw", base_model=BASE, replicas=[], served=[]))
    assert f"maxconn {haproxy.connection_limit()}" in front.config_path.read_text()
    monkeypatch.undo()
    door = subprocess.Popen(
        ["prlimit", "--nofile=1024:1024", *front.command_line()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while door.poll() is None and time.monotonic() < deadline:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.2)
        else:
            answer = None
        assert door.poll() is None, door.communicate()[0]
        # Up and answering (no key: refused), not gone at its start.
        assert answer is not None and answer.status_code == 401, answer
    finally:
        door.terminate()
        door.wait(timeout=10)
