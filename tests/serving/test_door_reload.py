"""A reload's old HAProxy worker still answers the kept-alive connections it
holds, once each, from its old maps: a model only the new worker routes (or a
key or grant pushed after the reload) must not get a wrong 404 or 401 there,
but a 503 asking to retry, which a client sends on a new connection to the new
worker. A REAL HAProxy in front of stand-in replicas."""

from __future__ import annotations

import http.client
import json
import time
from hashlib import sha256

import pytest

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.support.haproxy import needs_haproxy, open_access, running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

BASE = "tiny-llama"
NEW = "legal-contracts"


def table(urls, names):
    return routing_table(
        deployment="gw",
        base_model=BASE,
        replicas=[
            ReplicaView(i + 1, url, False, {n: f"/a/{n}" for n in names})
            for i, url in enumerate(urls)
        ],
        served=[ServedView(n, f"/a/{n}", held=False) for n in names],
    )


@pytest.fixture
def fleet():
    with running_fleet(2) as fleet:
        for replica in fleet.replicas:
            replica.adapters[NEW] = f"/a/{NEW}"
            replica.make_resident(NEW)
        yield fleet


def post(connection: http.client.HTTPConnection, model: str, key: str | None = None):
    body = json.dumps({"model": model, "prompt": "x", "max_tokens": 1})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    connection.request("POST", "/v1/completions", body, headers)
    response = connection.getresponse()
    return response.status, response.headers, json.loads(response.read() or b"{}")


def kept_alive(door: HAProxyFrontDoor) -> http.client.HTTPConnection:
    host, port = door.listen.split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def test_a_model_only_the_new_worker_routes_gets_a_503_to_retry_not_a_404(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls[:1], []))
    with running_haproxy(door, log=tmp_path / "log", access=open_access()):
        old = kept_alive(door)
        assert post(old, BASE)[0] == 200  # the connection is the old worker's now
        # A second replica is a reload; the new model is in the new worker only.
        changes = door.apply(table(fleet.urls, [NEW]))
        assert changes[0].startswith("reload"), changes

        status, headers, body = post(old, NEW)
        assert status == 503, body
        assert headers["Retry-After"] == "1"
        assert body["error"]["type"] == "ServiceUnavailableError"
        assert "retry" in body["error"]["message"]
        # Its answer closes the connection: the retry reaches the new worker.
        assert headers["Connection"] == "close"
        retry = kept_alive(door)
        assert post(retry, NEW)[0] == 200
        # A model no worker knows is still a 404 on the new worker.
        assert post(retry, "no-such-model")[0] == 404


def test_a_key_and_grant_pushed_after_the_reload_are_retried_on_the_old_worker(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls[:1], [NEW]))
    closed = DoorAccess(deployment="gw")  # no key yet
    with running_haproxy(door, log=tmp_path / "log", access=closed):
        old = kept_alive(door)
        assert post(old, NEW)[0] == 401  # answered, and kept alive by the old worker
        door.apply(table(fleet.urls, [NEW]))  # a second replica: a reload
        # A key and its grant arrive after the reload: the new worker's only.
        key = "sk-legal-" + "k" * 32
        hour = int(time.time()) + 3600
        door.apply_access(
            DoorAccess(
                deployment="gw",
                keys={sha256(key.encode()).hexdigest(): CallerKey(1, "legal", hour)},
                allowed=frozenset({("legal", NEW)}),
            )
        )
        # Never a wrong 401 or 404 from the old worker's stale maps: either the
        # old worker asks for a retry, or (Debian's HAProxy 2.6.12-1+deb12u4,
        # which closes the old worker's idle connections at a reload) the
        # client's new connection reaches the new worker, which knows the key.
        status, headers, body = post(old, NEW, key)
        assert status in (503, 200), body
        if status == 503:
            assert headers["Retry-After"] == "1"
        assert post(kept_alive(door), NEW, key)[0] == 200
        # Without a key the new worker still says 401.
        assert post(kept_alive(door), NEW)[0] == 401
