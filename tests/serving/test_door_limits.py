"""Limits at the front door, on a REAL HAProxy (Debian's 2.6) in front of a
stand-in replica: requests per minute per key and per department counted by
the door, callers refused for tokens from the `limited` map, each a 429 in
OpenAI's shape with Retry-After and x-ratelimit-* headers, checked with the
real `openai` client (RateLimitError; its retry waits what Retry-After says).
One department past its limit leaves another answered (what it costs the
other's latency: bench/door_limits.py).

The control plane's side (which callers the map lists): test_quotas.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests

from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.config import LUA_FILE
from serving.door.routing import ReplicaView, routing_table
from serving.rules.quotas import Limited
from tests.support.haproxy import needs_haproxy, requests_by_server, running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

pytestmark = needs_haproxy

BASE = "tiny-llama"
# Key ids are the door's counters' names: each test uses its own keys, so no
# test sees another's minute.
KEYS = {
    "sk-legal-a": (1, "legal"),
    "sk-legal-b": (2, "legal"),
    "sk-finance": (3, "finance"),
    "sk-ops-a": (4, "ops"),
    "sk-ops-b": (5, "ops"),
    "sk-tokens": (6, "research"),
    "sk-budget": (7, "research"),
    "sk-retry": (8, "retry"),
    "sk-client": (9, "clients"),
    "sk-batch": (10, "batch"),
    "sk-other": (11, "other"),
    "sk-live": (12, "live"),
    "sk-refused": (13, "refused"),
    "sk-choices": (14, "choices"),
    "sk-prompts": (15, "prompts"),
    "sk-work-dept": (16, "work"),
}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table(**extra) -> DoorAccess:
    hour = int(time.time()) + 3600
    departments = {department for _, department in KEYS.values()}
    return DoorAccess(
        deployment="gw",
        keys={
            sha(secret): CallerKey(key_id=key_id, department=department, expires_at=hour)
            for secret, (key_id, department) in KEYS.items()
        },
        allowed=frozenset((department, BASE) for department in departments),
        **extra,
    )


@dataclass
class Door:
    door: HAProxyFrontDoor
    url: str
    log: Path

    def call(self, key: str, session=None):
        return (session or requests).post(
            self.url + "/v1/completions",
            json={"model": BASE, "prompt": "The contract says", "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )

    def push(self, **extra) -> list[str]:
        return self.door.apply_access(access_table(**extra))


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[Door]:
    directory = tmp_path_factory.mktemp("limits")
    with running_fleet(1) as fleet:
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        front = HAProxyFrontDoor(directory, listen=f"127.0.0.1:{free_port()}")
        front.write(table)
        with running_haproxy(front, log=directory / "haproxy.log", access=access_table()):
            yield Door(front, f"http://{front.listen}", directory / "haproxy.log")


def logged(door: Door, backend: str, before: int, at_least: int) -> int:
    """The requests `backend` answered since `before`, once HAProxy has logged
    `at_least` of them (it writes a line as a request ends, a moment after the
    answer: a fixed 0.2 s was too short in the light run, niced beside vLLM)."""
    deadline = time.monotonic() + 30
    while True:
        count = requests_by_server(door.log)[(backend, "<NOSRV>", 429)] - before
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def room_in_this_minute(seconds: int) -> None:
    """Waits for the next minute if this one has fewer than `seconds` left: a
    test that counts a minute's requests must not see it end halfway."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def test_a_key_past_its_requests_per_minute_gets_a_429_in_openai_s_shape(door):
    door.push(rpm={"key:1": 3})
    room_in_this_minute(10)
    taken = [door.call("sk-legal-a") for _ in range(3)]
    asked = time.time()
    refused = door.call("sk-legal-a")
    answered = time.time()

    assert [r.status_code for r in taken] == [200, 200, 200]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in taken] == ["2", "1", "0"]
    assert all(r.headers["x-ratelimit-limit-requests"] == "3" for r in taken)
    assert refused.status_code == 429
    assert refused.json() == {
        "error": {
            "message": "Rate limit reached for key 1 on requests per min (RPM): Limit 3. "
            f"Please try again in {refused.headers['Retry-After']}s.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    # Retry-After is the seconds until the minute ends, when the count starts again:
    # as of the moment HAProxy answered, between `asked` and `answered` (the
    # light run is niced beside vLLM: the test may wait a while on either side).
    retry_after = int(refused.headers["Retry-After"])
    assert 60 - answered % 60 - 1.5 <= retry_after <= 60 - asked % 60 + 1.5
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"] == refused.headers["Retry-After"] + "s"
    # Another key of the same department has its own count (no department limit set).
    assert door.call("sk-legal-b").status_code == 200


def test_a_department_s_limit_counts_all_its_keys_and_no_one_else_s(door):
    door.push(rpm={"dept:ops": 4, "key:4": 10})
    room_in_this_minute(10)
    answers = [door.call(key).status_code for key in ["sk-ops-a", "sk-ops-b"] * 3]
    refused = door.call("sk-ops-a")

    assert answers == [200, 200, 200, 200, 429, 429]
    assert refused.status_code == 429
    assert "department ops" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-limit-requests"] == "4"
    assert door.call("sk-finance").status_code == 200


def told(response) -> tuple[str, str]:
    return (
        response.headers["x-ratelimit-limit-requests"],
        response.headers["x-ratelimit-remaining-requests"],
    )


def test_a_taken_request_reports_the_tighter_of_its_key_s_and_department_s_limits(door):
    door.push(rpm={"dept:other": 100, "key:11": 5})
    room_in_this_minute(10)
    first = door.call("sk-other")
    assert told(first) == ("5", "4")

    door.push(rpm={"dept:other": 3, "key:11": 5})
    second = door.call("sk-other")
    # The department's minute has counted one request already.
    assert told(second) == ("3", "1")


def post(door: Door, key: str, body: bytes | dict):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(
        door.url + "/v1/completions",
        data=data,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=30,
    )


def test_refused_requests_count_toward_the_caller_s_minute(door):
    # Each refused request took the door's work (its body read, its grant
    # looked up): before, it counted toward nothing.
    door.push(rpm={"key:13": 4})
    room_in_this_minute(10)
    answers = [
        post(door, "sk-refused", b'{"model":1}').status_code,  # 400: the body
        post(door, "sk-refused", {"model": "nobody-s", "prompt": "x"}).status_code,  # 404
        post(door, "sk-refused", {"model": BASE, "prompt": "x"}).status_code,
        post(door, "sk-refused", {"model": BASE, "chat_template": "x"}).status_code,  # 400
        post(door, "sk-refused", {"model": BASE, "prompt": "x"}).status_code,
    ]
    assert answers == [400, 404, 200, 400, 429]


def test_n_choices_count_as_that_many_requests(door):
    door.push(rpm={"key:14": 5})
    room_in_this_minute(10)
    first = post(door, "sk-choices", {"model": BASE, "prompt": "x", "n": 3, "max_tokens": 1})
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    # 3 more would be 6 of 5.
    second = post(door, "sk-choices", {"model": BASE, "prompt": "x", "n": 3, "max_tokens": 1})
    assert second.status_code == 429
    # A refused request counts too, as every 429 does (its count is past the
    # limit): nothing is left in this minute.
    assert post(door, "sk-choices", {"model": BASE, "prompt": "x"}).status_code == 429


def test_a_list_of_prompts_counts_as_its_prompts_times_n(door):
    door.push(rpm={"key:15": 10, "dept:work": 100})
    room_in_this_minute(10)
    prompts = {"model": BASE, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1}
    first = post(door, "sk-prompts", prompts)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-requests"] == "4"
    # A list of token ids is one prompt.
    tokens = {"model": BASE, "prompt": [1, 2, 3, 4], "max_tokens": 1}
    assert post(door, "sk-prompts", tokens).headers["x-ratelimit-remaining-requests"] == "3"
    assert post(door, "sk-prompts", prompts).status_code == 429


def test_work_the_door_could_not_count_is_a_503_never_routed(tmp_path):
    # A door.lua whose count of the work raises (any bug in it would): the
    # request is not taken at a count of one.
    broken = tmp_path / "door.lua"
    source = LUA_FILE.read_text()
    marker = "local function add_work(txn, sc, used_var, limit_var, others_var, extra)\n"
    assert marker in source
    broken.write_text(source.replace(marker, marker + '  error("forced")\n'))
    with running_fleet(1) as fleet:
        table = routing_table(
            deployment="gw",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        front = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
        front.write(table)
        config = front.config_path.read_text()
        front.config_path.write_text(
            config.replace(f"lua-load {LUA_FILE.resolve()}", f"lua-load {broken}")
        )
        access = access_table(rpm={"key:14": 100})
        with running_haproxy(front, log=tmp_path / "haproxy.log", access=access):
            door = Door(front, f"http://{front.listen}", tmp_path / "haproxy.log")
            one = post(door, "sk-choices", {"model": BASE, "prompt": "x", "max_tokens": 1})
            assert one.status_code == 200, one.text
            calls = fleet.replicas[0].calls.get("completions", 0)
            many = post(door, "sk-choices", {"model": BASE, "prompt": "x", "n": 3})
            assert many.status_code == 503, many.text
            assert "did not finish" in many.json()["error"]["message"]
            assert fleet.replicas[0].calls.get("completions", 0) == calls


def test_a_department_s_minute_counts_the_work_too(door):
    door.push(rpm={"dept:work": 4})
    room_in_this_minute(10)
    body = {"model": BASE, "prompt": ["a", "b", "c"], "max_tokens": 1}
    assert post(door, "sk-work-dept", body).status_code == 200
    refused = post(door, "sk-work-dept", body)
    assert refused.status_code == 429
    assert "department work" in refused.json()["error"]["message"]


def test_limits_change_at_runtime_without_a_reload(door):
    worker = door.door.runtime.worker_pid()
    room_in_this_minute(10)
    door.push(rpm={"key:12": 1})
    assert [door.call("sk-live").status_code for _ in range(2)] == [200, 429]
    door.push(rpm={"key:12": 50})
    assert door.call("sk-live").status_code == 200
    door.push()
    assert "x-ratelimit-limit-requests" not in door.call("sk-live").headers
    assert door.door.runtime.worker_pid() == worker


def test_a_caller_refused_for_tokens_gets_a_429_until_the_time_the_map_says(door):
    now = int(time.time())
    door.push(limited={"key:6": Limited(until=now + 30, limit="tokens_per_minute", value=1000)})
    refused = door.call("sk-tokens")
    answered = int(time.time())

    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert "key 6 on tokens per min (TPM): Limit 1000" in error["message"]
    # The seconds left until `until` when HAProxy answered: from the push to the
    # answer may take a while in the light run (niced beside vLLM).
    assert now + 30 - answered - 2 <= int(refused.headers["Retry-After"]) <= 30
    assert refused.headers["x-ratelimit-limit-tokens"] == "1000"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    # A passed time refuses nobody, even before the next push removes it.
    door.push(limited={"key:6": Limited(until=now - 1, limit="tokens_per_minute", value=1000)})
    assert door.call("sk-tokens").status_code == 200


def test_a_department_past_its_budget_gets_insufficient_quota_for_all_its_keys(door):
    until = int(time.time()) + 5 * 3600
    door.push(limited={"dept:research": Limited(until, "tokens_per_day", 50_000)})
    for key in ("sk-tokens", "sk-budget"):
        refused = door.call(key)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
        assert error["message"].startswith(
            "department research has used its token budget (tokens_per_day: 50000)"
        )
    assert door.call("sk-finance").status_code == 200


def client(door: Door, key: str, retries: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=door.url + "/v1", api_key=key, max_retries=retries)


def test_the_openai_client_raises_rate_limit_error_with_the_door_s_answer(door):
    door.push(rpm={"key:9": 1})
    room_in_this_minute(10)
    calls = client(door, "sk-client", retries=0)
    calls.completions.create(model=BASE, prompt="Hello", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as raised:
        calls.completions.create(model=BASE, prompt="Hello", max_tokens=1)
    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"
    assert raised.value.response.headers["x-ratelimit-limit-requests"] == "1"


def test_the_openai_client_s_retry_waits_what_retry_after_says_then_gets_through(door):
    # Refused for 4-5 s from the push: its first request must come before that
    # time even when the light run (niced beside vLLM) waits for the CPU.
    door.push(limited={"key:8": Limited(int(time.time()) + 5, "tokens_per_minute", 10)})
    before = requests_by_server(door.log)[("door_429_tokens", "<NOSRV>", 429)]
    started = time.monotonic()
    answer = client(door, "sk-retry", retries=3).completions.create(
        model=BASE, prompt="Hello", max_tokens=1
    )
    waited = time.monotonic() - started

    assert answer.choices
    refusals = logged(door, "door_429_tokens", before, at_least=1)
    # Its own backoff would have retried after 0.5-1 s, three times, and failed:
    # it waited the door's few seconds instead, once, and got through. (The
    # upper bound leaves room for a niced light run's stalls.)
    assert refusals == 1
    assert 1.9 <= waited <= 12, waited


def test_the_openai_client_does_not_retry_a_budget_that_renews_in_hours(door):
    door.push(limited={"dept:research": Limited(int(time.time()) + 7200, "tokens_per_day", 5)})
    before = requests_by_server(door.log)[("door_429_budget", "<NOSRV>", 429)]
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as raised:
        client(door, "sk-budget", retries=2).completions.create(
            model=BASE, prompt="Hello", max_tokens=1
        )
    assert raised.value.code == "insufficient_quota"
    # No wait of its own: a retry shows in the count below; this bound leaves
    # room for a niced light run's stalls.
    assert time.monotonic() - started < 10
    assert logged(door, "door_429_budget", before, at_least=1) == 1


# The load of a department past its limit: as fast as it can, from another
# process (so that the measuring client's latency is not this process's GIL).
# Each thread runs `seconds` and at least LEAST requests: in the light run
# (niced beside vLLM) 8 s may be few requests, and the counts below need more
# than 10 refusals per answer even when a minute's edge lets 120 through.
LOAD = """
import http.client, sys, threading, time
host, port, key, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
body = b'{"model": "tiny-llama", "prompt": "load", "max_tokens": 1}'
counts = {}
LEAST = 400
def run():
    connection = http.client.HTTPConnection(host, port, timeout=30)
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end or sent < LEAST:
        sent += 1
        connection.request("POST", "/v1/completions", body, {
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        counts[response.status] = counts.get(response.status, 0) + 1
threads = [threading.Thread(target=run) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(" ".join(f"{k}:{v}" for k, v in sorted(counts.items())))
"""


def statuses(door: Door, key: str, count: int) -> list[int]:
    session = requests.Session()
    return [door.call(key, session).status_code for _ in range(count)]


def test_a_department_past_its_limit_leaves_another_served(door):
    """Batch, past its 60 a minute, is refused thousands of times while finance
    is answered every time. How much the refused load slows finance is a
    timed figure on shared cores, so it is a bench: bench/door_limits.py."""
    door.push(rpm={"dept:batch": 60, "dept:finance": 100_000})
    host, port = door.door.listen.rsplit(":", 1)
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, host, port, "sk-batch", "8"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # batch is past its 60 a minute by now
    during_statuses = statuses(door, "sk-finance", 200)
    out, _ = load.communicate(timeout=300)
    counts = dict(pair.split(":") for pair in out.split())

    print(f"finance answers {set(during_statuses)} while batch got {counts}")
    assert set(during_statuses) == {200}
    assert int(counts["429"]) > 10 * int(counts.get("200", 0)) > 0
    assert int(counts.get("200", 0)) <= 60 * 2  # a minute's edge may fall inside the run
