"""Requests per minute counted across a deployment's doors, on 3 REAL HAProxy
processes on loopback, each in front of the same stand-in replica and told
the others with HAProxy's `peers` (docs/door.md#peers): a caller gets its
limit, not 3 times it, and a reload keeps the counts.

One door without peers (the rest of test_door_limits.py) counts as before."""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor, Peer
from serving.door.haproxy.config import render_config
from serving.door.routing import ReplicaView, routing_table
from tests.support.haproxy import needs_haproxy, peer_sessions, running_haproxy, wait_held
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

BASE = "tiny-llama"
# Each test its own key: no test sees another's minute.
KEYS = {"sk-spread": (1, "legal"), "sk-reload": (2, "ops"), "sk-dept-a": (3, "finance")}
KEYS["sk-dept-b"] = (4, "finance")
KEYS["sk-work"] = (5, "work")


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table(rpm: dict[str, int]) -> DoorAccess:
    hour = int(time.time()) + 3600
    return DoorAccess(
        deployment="gw",
        keys={
            sha(secret): CallerKey(key_id=key_id, department=department, expires_at=hour)
            for secret, (key_id, department) in KEYS.items()
        },
        allowed=frozenset((department, BASE) for _, department in KEYS.values()),
        rpm=rpm,
    )


@dataclass
class Doors:
    doors: list[HAProxyFrontDoor]
    table_of_two: object

    def call(self, index: int, key: str) -> requests.Response:
        return requests.post(
            f"http://{self.doors[index].listen}/v1/completions",
            json={"model": BASE, "prompt": "The contract says", "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )

    def push(self, rpm: dict[str, int]) -> None:
        for door in self.doors:
            door.apply_access(access_table(rpm))


def connected(door: HAProxyFrontDoor, others: int) -> bool:
    """Whether `door` has a peers session established with each other door."""
    return peer_sessions(door.runtime) >= others


def wait_connected(doors: list[HAProxyFrontDoor], timeout: float = 60.0) -> None:
    """Until every door's sessions with the others have held for 3 s."""
    wait_held(
        lambda: all(connected(door, len(doors) - 1) for door in doors),
        lambda: "the doors' peers sessions did not settle",
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def doors(tmp_path_factory) -> Iterator[Doors]:
    root = tmp_path_factory.mktemp("peers")
    with running_fleet(2) as fleet:
        replicas = [ReplicaView(i + 1, url, False, {}) for i, url in enumerate(fleet.urls)]
        table = routing_table(deployment="gw", base_model=BASE, replicas=replicas[:1], served=[])
        peers = tuple(Peer(f"door-{i}", f"127.0.0.1:{free_port()}") for i in range(3))
        fronts = [
            HAProxyFrontDoor(
                root / peer.name,
                listen=f"127.0.0.1:{free_port()}",
                peers=peers,
                peer_name=peer.name,
            )
            for peer in peers
        ]
        with contextlib.ExitStack() as stack:
            for front in fronts:
                front.write(table)
                stack.enter_context(
                    running_haproxy(
                        front, log=front.directory / "haproxy.log", access=access_table({})
                    )
                )
            wait_connected(fronts)
            two = routing_table(deployment="gw", base_model=BASE, replicas=replicas, served=[])
            yield Doors(fronts, two)


def room_in_this_minute(seconds: int) -> None:
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def counted(door: HAProxyFrontDoor, caller: str) -> int:
    """`caller`'s count in this door's copy of every door's table, this minute
    and the one before (HAProxy's own view, from `show table`)."""
    total = 0
    for peer in door.peers:
        answer = door.runtime.command(f"show table door_rates_{peer.name}")
        total += sum(int(n) for n in re.findall(rf"key={caller}:\d+ .*gpc0=(\d+)", answer))
    return total


def wait_counted(doors: list[HAProxyFrontDoor], caller: str, total: int) -> None:
    # The peers protocol pushes an update a moment after it is made.
    deadline = time.monotonic() + 10
    while any(counted(door, caller) != total for door in doors):
        assert time.monotonic() < deadline, [counted(door, caller) for door in doors]
        time.sleep(0.05)


def test_a_key_s_limit_holds_across_three_doors(doors):
    limit = 200
    doors.push({"key:1": limit})
    room_in_this_minute(30)

    # Twice the limit, spread evenly over the 3 doors by 6 callers at once.
    # A door adds the counts the others last pushed, so a few requests may
    # pass at the crossing: the limit is large enough that 10 % is room.
    total = 2 * limit
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: doors.call(i % 3, "sk-spread").status_code, range(total)))

    taken = answers.count(200)
    assert answers.count(429) == total - taken
    # Each door alone would have taken all of its third (400 in all).
    assert limit * 0.9 <= taken <= limit * 1.1
    # Every door took some and refused some: the count is shared, not split.
    for index in range(3):
        mine = answers[index::3]
        assert 200 in mine and 429 in mine


def test_a_department_s_limit_counts_its_keys_at_every_door(doors):
    doors.push({"dept:finance": 4})
    room_in_this_minute(20)
    keys = ["sk-dept-a", "sk-dept-b"] * 2
    answers = [doors.call(i % 3, key).status_code for i, key in enumerate(keys)]
    # Once every door has every door's count (the peers push it a moment
    # later: a few ms here, more on a starved machine), none takes another.
    wait_counted(doors.doors, "dept:finance", 4)
    later = [doors.call(i, "sk-dept-b").status_code for i in range(3)]

    assert answers == [200, 200, 200, 200]
    assert later == [429, 429, 429]


def test_n_choices_at_one_door_count_on_the_others_counts(doors):
    doors.push({"key:5": 5})
    room_in_this_minute(20)
    assert [doors.call(0, "sk-work").status_code for _ in range(2)] == [200, 200]
    wait_counted(doors.doors, "key:5", 2)

    # door.lua's count_work adds the 2 more of n=3 on top of door 0's 2.
    three = requests.post(
        f"http://{doors.doors[1].listen}/v1/completions",
        json={"model": BASE, "prompt": "x", "max_tokens": 1, "n": 3},
        headers={"Authorization": "Bearer sk-work"},
        timeout=30,
    )
    assert three.status_code == 200
    assert three.headers["x-ratelimit-remaining-requests"] == "0"
    wait_counted(doors.doors, "key:5", 5)
    assert doors.call(2, "sk-work").status_code == 429


def test_a_reload_keeps_the_counts(doors):
    doors.push({"key:2": 8})
    room_in_this_minute(30)
    first = [doors.call(i % 3, "sk-reload").status_code for i in range(5)]
    assert first == [200] * 5
    wait_counted(doors.doors, "key:2", 5)

    # A second replica: the door reloads (a new worker, with new tables),
    # which takes its counts from its old worker and the other doors.
    reloaded = doors.doors[0]
    old = reloaded.runtime.worker_pid()
    changes = reloaded.apply(doors.table_of_two)
    assert any(change.startswith("reload") for change in changes)
    assert reloaded.runtime.worker_pid() != old
    wait_connected(doors.doors)
    wait_counted([reloaded], "key:2", 5)

    after = [doors.call(0, "sk-reload") for _ in range(4)]
    assert [r.status_code for r in after] == [200, 200, 200, 429]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in after] == ["2", "1", "0", "0"]


def test_a_door_not_among_its_peers_is_refused(tmp_path: Path):
    peers = (Peer("door-0", "127.0.0.1:1"), Peer("door-1", "127.0.0.1:2"))
    with pytest.raises(ValueError, match="door-9"):
        HAProxyFrontDoor(tmp_path, listen="127.0.0.1:3", peers=peers, peer_name="door-9")


def test_a_door_alone_renders_no_peers_and_its_one_table():
    table = routing_table(deployment="gw", base_model=BASE, replicas=[], served=[])
    alone = render_config(table, Path("/tmp/gw"), listen="127.0.0.1:1")
    assert "peers" not in alone
    assert "table door_rates " in alone
    assert "table_gpc0" not in alone


def test_a_process_whose_door_is_not_among_its_deployment_s_peers_stops(settings, tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    from serving.door.services import front_door_for
    from serving.models import Deployment

    settings.SERVING_DOORS = {"prod": "127.0.0.1:9"}
    settings.SERVING_DOOR_DIR = tmp_path
    settings.SERVING_DOOR_PEERS = {"prod": (("door-0", "127.0.0.1:1"), ("door-1", "127.0.0.1:2"))}
    settings.SERVING_DOOR_PEER_NAME = "web-7"
    with pytest.raises(ImproperlyConfigured, match="web-7"):
        front_door_for(Deployment(name="prod"))

    settings.SERVING_DOOR_PEER_NAME = "door-1"
    door = front_door_for(Deployment(name="prod"))
    assert door.command_line()[-2:] == ["-L", "door-1"]
