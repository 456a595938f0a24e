"""The door's hold (door.lua `hold_model`, held.map) on a REAL HAProxy (Debian's
2.6) in front of two stand-in replicas: a held request waits, then goes where
the door routes once the hold ends; a hold past its deadline, or a request's
own bound, lets it through; other models are not delayed; clients can neither
set nor lift a hold. The engine holding under traffic on real vLLM:
tests/serving/vllm/test_hold_real.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from tests.support.haproxy import (
    held_ms,
    needs_haproxy,
    open_access,
    raw_request,
    running_haproxy,
)
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

BASE = "tiny-llama"
HELD = "legal-contracts"  # on r1 only
OTHER = "finance-invoices"  # on both
# Each request's own bound (SERVING_DOOR_HOLD_SECONDS), short for the tests.
MOST_SECONDS = 3.0
# A held request waits at least MOST_SECONDS; one answered well before was not
# held. (Not 1.0 s: the light tests run niced beside vLLM, where a Python
# thread can wait a second for a core.)
NOT_HELD_SECONDS = MOST_SECONDS - 0.5


@dataclass
class Door:
    door: HAProxyFrontDoor
    url: str
    replicas: list
    log: Path

    def table(self, held_on: list[int]):
        """legal-contracts on the replicas `held_on` (1-based), finance-invoices on both."""
        return routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[
                ReplicaView(
                    i,
                    r.base_url,
                    False,
                    {OTHER: f"/a/{OTHER}", **({HELD: f"/a/{HELD}"} if i in held_on else {})},
                )
                for i, r in enumerate(self.replicas, start=1)
            ],
            served=[
                ServedView(HELD, f"/a/{HELD}", held=False),
                ServedView(OTHER, f"/a/{OTHER}", held=False),
            ],
        )


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[Door]:
    directory = tmp_path_factory.mktemp("hold")
    with running_fleet(2) as fleet:
        for replica in fleet.replicas:
            for name in (HELD, OTHER):
                replica.adapters[name] = f"/a/{name}"
                replica.make_resident(name)
        front = HAProxyFrontDoor(
            directory, listen=f"127.0.0.1:{free_port()}", hold_seconds=MOST_SECONDS
        )
        made = Door(front, f"http://{front.listen}", fleet.replicas, directory / "haproxy.log")
        front.write(made.table([1]))
        with running_haproxy(front, log=made.log, access=open_access()):
            yield made


@pytest.fixture(autouse=True)
def routes_as_the_module_set_them(door):
    yield
    for model in door.door.holds():
        door.door.runtime.command(f"del map {door.door.held_map_path} {model}")
    door.door.apply(door.table([1]))


class Sent:
    """A completion sent in a thread: its status, the seconds it took, and the
    replica that answered it."""

    def __init__(self, door: Door, model: str, **request):
        self.status = 0
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._send, args=(door, model, request))
        self._thread.start()

    def _send(self, door, model, request):
        started = time.monotonic()
        body = {"model": model, "prompt": "The contract says", "max_tokens": 1}
        response = requests.post(
            door.url + "/v1/completions" + request.get("query", ""),
            json={**body, **request.get("extra", {})},
            headers=request.get("headers"),
            timeout=30,
        )
        self.status = response.status_code
        self.seconds = time.monotonic() - started

    def wait(self) -> Sent:
        self._thread.join(30)
        return self


def completions(replica, model: str) -> int:
    return sum(
        1
        for _, path, body in replica.requests
        if path.endswith("completions") and body.get("model") == model
    )


def logged(door: Door, model: str, since: int) -> list[int]:
    """held_ms of `model`'s requests logged from byte `since` on, once there is
    one (HAProxy writes a line as the request ends, a moment after its answer)."""
    deadline = time.monotonic() + 5
    while not (found := held_ms(door.log, model, since)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_a_held_request_waits_then_goes_to_the_replica_the_door_routes_to_after(door):
    front = door.door
    r1, r2 = door.replicas
    # The swap's take-out: r1 is the only replica of HELD, so the door holds it.
    taken = front.take_out(HELD, "r1", timeout=5, hold_seconds=10, owner="swap1")
    assert taken.held and taken.busy == 0
    assert taken.changes[0].startswith(f"add map {front.held_map_path} {HELD} ")
    assert "set server m_legal-contracts/r1 state drain" in taken.changes
    # In the file too: a reload or a restart holds it as well.
    assert f"{HELD} " in front.held_map_path.read_text()
    before = (completions(r1, HELD), completions(r2, HELD))
    since = door.log.stat().st_size

    held = Sent(door, HELD)
    time.sleep(1.0)
    assert held.status == 0  # still waiting
    # The swap's end, as if it had moved: r2 ready. Then the hold goes.
    assert front.ready(HELD, "r2") == ["set server m_legal-contracts/r2 state ready"]
    assert front.release(HELD, owner="someone-else") == []  # not its hold
    assert front.release(HELD, owner="swap1") == [f"del map {front.held_map_path} {HELD}"]
    held.wait()

    assert held.status == 200
    assert held.seconds >= 1.0
    # The backend was chosen after the hold: r2, which was not serving when it arrived.
    assert (completions(r1, HELD), completions(r2, HELD)) == (before[0], before[1] + 1)
    assert logged(door, HELD, since)[-1] >= 900
    assert front.holds() == {}
    assert HELD not in front.held_map_path.read_text()


def test_a_hold_past_its_deadline_or_the_request_s_own_bound_lets_it_through(door):
    front = door.door
    since = door.log.stat().st_size
    front.hold(HELD, seconds=1.0, owner="gone")  # a worker that died holding it
    front.hold(OTHER, seconds=60, owner="far")  # a deadline past the request's bound
    by_deadline, by_bound = Sent(door, HELD), Sent(door, OTHER)
    by_deadline.wait()
    by_bound.wait()
    assert by_deadline.status == by_bound.status == 200
    # How long each was held, as HAProxy measured it (the client's own clock
    # also counts its thread's waits for a core in the niced light run): the
    # first until the hold's deadline, well before the request's own bound.
    [held_by_deadline] = logged(door, HELD, since)
    [held_by_bound] = logged(door, OTHER, since)
    assert 0 < held_by_deadline < MOST_SECONDS * 1000 - 1000
    assert MOST_SECONDS * 1000 - 50 <= held_by_bound < MOST_SECONDS * 1000 + 2000
    assert by_bound.seconds >= MOST_SECONDS - 0.2
    # The next sync removes the expired hold; the other one is not expired yet.
    changes = front.apply(door.table([1]))
    assert changes == [f"del map {front.held_map_path} {HELD}"]
    assert set(front.holds()) == {OTHER}


def test_a_request_for_another_model_is_not_delayed(door):
    door.door.hold(HELD, seconds=10, owner="swap2")
    since = door.log.stat().st_size
    others = [Sent(door, OTHER), Sent(door, BASE)]
    for sent in others:
        assert sent.wait().status == 200
        assert sent.seconds < NOT_HELD_SECONDS
    time.sleep(0.5)  # their log lines
    assert door.log.stat().st_size > since
    assert held_ms(door.log, OTHER, since) == []  # never entered the hold


def test_a_client_can_neither_lift_a_hold_nor_set_one(door):
    front = door.door
    front.hold(HELD, seconds=10, owner="swap3")
    # Nothing a client sends lifts it: headers, a query, the body's other keys.
    tries = [
        Sent(door, HELD, headers={"X-Held": "0", "Cookie": "held=0"}),
        Sent(door, HELD, query="?held=0&release=1"),
        Sent(door, HELD, extra={"held": False, "hold": 0}),
    ]
    time.sleep(1.0)
    assert [t.status for t in tries] == [0, 0, 0]
    # The runtime API is a UNIX socket only: its commands sent to the client
    # port are a request like any other, refused, and change no map.
    for line in (
        f"del map {front.held_map_path} {HELD}",
        f"add map {front.held_map_path} {OTHER} 9",
    ):
        status, _ = raw_request(front.listen, "POST", "/", line.encode())
        assert status == 404
    assert set(front.holds()) == {HELD}
    assert Sent(door, OTHER).wait().seconds < NOT_HELD_SECONDS
    front.release(HELD, owner="swap3")
    assert [t.wait().status for t in tries] == [200, 200, 200]


def test_a_take_out_whose_caller_must_stop_leaves_no_hold(door):
    def cancelled():
        raise RuntimeError("the rollout was cancelled")

    with pytest.raises(RuntimeError):
        door.door.take_out(HELD, "r1", timeout=5, hold_seconds=10, owner="stop", tick=cancelled)
    assert door.door.holds() == {}
    assert HELD not in door.door.held_map_path.read_text()
