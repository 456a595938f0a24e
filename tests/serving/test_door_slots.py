"""A new adapter routes the moment it is promoted: it takes one of the free
backend slots HAProxy was started with (runtime commands, no reload); a reload
comes only when a replica is added or the pool runs out, and then renders it
as its own backend. A REAL HAProxy in front of stand-in replicas."""

from __future__ import annotations

import time

import pytest
import requests

from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.maps import SLOTS
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.support.haproxy import needs_haproxy, open_access, running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy


def table(urls, names, on=None):
    """Every name served on the replicas `on` (default all) of `urls`."""
    on = range(len(urls)) if on is None else on
    return routing_table(
        deployment="gw",
        base_model="tiny-llama",
        replicas=[
            ReplicaView(i + 1, url, False, {n: f"/a/{n}" for n in names} if i in on else {})
            for i, url in enumerate(urls)
        ],
        served=[ServedView(n, f"/a/{n}", held=False) for n in names],
    )


def complete(url, model):
    body = {"model": model, "prompt": "x", "max_tokens": 1}
    return requests.post(f"{url}/v1/completions", json=body, timeout=10)


@pytest.fixture
def fleet():
    with running_fleet(2, max_cpu_loras=64) as fleet:
        for replica in fleet.replicas:
            for n in [f"a{i}" for i in range(SLOTS + 2)]:
                replica.adapters[n] = f"/a/{n}"
                replica.make_resident(n)
        yield fleet


def test_a_new_adapter_takes_a_free_slot_and_routes_at_once_without_a_reload(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls, []))
    url = f"http://{door.listen}"
    with running_haproxy(door, log=tmp_path / "log", access=open_access()):
        worker = door.runtime.worker_pid()
        assert complete(url, "a0").status_code == 404
        started = time.monotonic()
        changes = door.apply(table(fleet.urls, ["a0"], on=[1]))
        response = complete(url, "a0")
        routed = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert door.runtime.worker_pid() == worker
        assert not any(c.startswith("reload") for c in changes)
        assert changes[-1] == f"add map {door.map_path} a0 slot_0"
        # At once: no reload (the worker and the changes above) and no wait; 5 s
        # leaves room for the light run's stalls (niced beside vLLM).
        assert routed < 5.0
        # Only to the replica that holds it, and counted under its name.
        assert fleet.replicas[0].calls.get("completions:a0", 0) == 0
        assert door.model_counters()["a0"].requests == 1
        # A swap drains it there and puts it back, in its slot.
        assert door.drain("a0", "r2", timeout=5, keep_one=False) == [
            "set server slot_0/r2 state drain"
        ]
        assert door.ready("a0", "r2") == ["set server slot_0/r2 state ready"]
        # Synced again: nothing to do.
        assert door.apply(table(fleet.urls, ["a0"], on=[1])) == []


def test_a_reload_renders_slotted_adapters_as_their_own_backends(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls[:1], []))
    url = f"http://{door.listen}"
    with running_haproxy(door, log=tmp_path / "log", access=open_access()):
        door.apply(table(fleet.urls[:1], ["a0"]))
        assert door.runtime.map_entries(door.map_path)["a0"] == "slot_0"
        # A second replica: every backend needs its server, a reload.
        changes = door.apply(table(fleet.urls, ["a0"]))
        assert changes[0].startswith("reload")
        assert door.runtime.map_entries(door.map_path)["a0"] == "m_a0"
        assert complete(url, "a0").status_code == 200


def test_more_new_adapters_than_free_slots_is_one_reload(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls, []))
    url = f"http://{door.listen}"
    names = [f"a{i}" for i in range(SLOTS + 1)]
    with running_haproxy(door, log=tmp_path / "log", access=open_access()):
        changes = door.apply(table(fleet.urls, names))
        assert sum(c.startswith("reload") for c in changes) == 1
        assert all(complete(url, n).status_code == 200 for n in names)


def test_a_slot_a_retired_adapter_used_is_not_given_to_the_next_one(fleet, tmp_path):
    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table(fleet.urls, []))
    url = f"http://{door.listen}"
    with running_haproxy(door, log=tmp_path / "log", access=open_access()):
        door.apply(table(fleet.urls, ["a0"]))
        assert complete(url, "a0").status_code == 200
        door.apply(table(fleet.urls, []))  # retired
        assert complete(url, "a0").status_code == 404
        door.apply(table(fleet.urls, ["a1"]))
        # Its counts stay with the slot it had; the next adapter starts at zero.
        assert door.runtime.map_entries(door.map_path)["a1"] == "slot_1"
        assert door.model_counters()["a1"].requests == 0
