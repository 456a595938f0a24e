"""A deployment of ONE real vLLM 0.32 replica behind a real HAProxy: version
swaps and rollbacks run by the product's rollout engine under continuous
client traffic through the door fail no request, because the door holds the
adapter's new requests while its only replica swaps (docs/door.md#holding),
and what clients get after each rollout is the version it put there."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests

from serving.models import HttpAttempt
from tests.serving.vllm.conftest import adapters_on, ok
from tests.serving.vllm.test_door_routes_real import _deployment_behind_a_front_door, routed_after
from tests.support.adapters import AdapterSpec
from tests.support.haproxy import (
    held_ms,
    needs_haproxy,
    open_access,
    retried_requests,
    running_haproxy,
    vllm_404s,
)

pytestmark = [
    pytest.mark.vllm,
    needs_haproxy,
]

NAME = "legal-contracts"


class Answers:
    """Clients sending greedy completions for NAME through the door until
    stopped; each answer kept as (sent at, ended at, status, what it said)."""

    def __init__(self, url: str, clients: int = 3):
        self.url = url
        self.results: list[tuple[float, float, int, tuple | str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        session = requests.Session()
        body = {"model": NAME, "prompt": "The contract says", "max_tokens": 2, "temperature": 0,
                "logprobs": 1}  # fmt: skip
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = session.post(self.url + "/v1/completions", json=body, timeout=60)
                status = response.status_code
                said = _said(response.json()) if status == 200 else response.text[:300]
            except requests.RequestException as error:
                status, said = 0, str(error)
            with self._lock:
                self.results.append((sent, time.monotonic(), status, said))

    def __enter__(self) -> Answers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def said_between(self, start: float, end: float) -> list:
        """What the requests sent in [start, end) said."""
        with self._lock:
            return [said for sent, _, status, said in self.results if start <= sent < end]


def _said(body: dict) -> tuple:
    """The tokens and their log-probabilities, rounded: a version's answer to
    the same greedy prompt (another version's differs by far more)."""
    choice = body["choices"][0]
    return (choice["text"], tuple(round(p, 2) for p in choice["logprobs"]["token_logprobs"]))


@pytest.mark.django_db(transaction=True)
def test_on_one_replica_swaps_and_rollbacks_fail_no_request_through_the_door(
    platform, vllm_server, celery_worker, settings, tmp_path
):
    deployment, url = _deployment_behind_a_front_door(
        platform, [vllm_server], settings, tmp_path, "gw-single"
    )
    versions = [
        platform.approved_version("contracts", NAME, AdapterSpec(seed=seed))
        for seed in (7, 8, 9, 10)
    ]
    from serving.door.services import front_door_for

    log = tmp_path / "haproxy.log"
    door = front_door_for(deployment)
    with running_haproxy(door, log=log, access=open_access()):
        first = platform.promote_and_wait("gw-single", versions[0]["id"])
        assert first["status"] == "succeeded", first["error"]
        routed_after(url, NAME)
        since = vllm_server.log_path.stat().st_size
        ended: list[tuple[float, dict]] = []
        with Answers(url) as answers:
            time.sleep(1.0)
            started = time.monotonic()
            for version in versions[1:]:
                swap = platform.promote_and_wait("gw-single", version["id"])
                assert swap["status"] == "succeeded", swap["error"]
                ended.append((time.monotonic(), swap))
                time.sleep(1.0)
                back = ok(platform.admin.post(f"/api/v1/rollouts/{swap['id']}/rollback/"), 202)
                rollback = platform.wait_rollout(back["id"])
                assert rollback["status"] == "succeeded", rollback["error"]
                ended.append((time.monotonic(), rollback))
                time.sleep(1.0)
        assert adapters_on(vllm_server) == {NAME: first["served_path"]}
        assert door.holds() == {}

    failed = [r for r in answers.results if r[2] != 200]
    assert len(answers.results) > 100
    assert failed == [], failed[:5]
    assert vllm_404s(vllm_server.log_path, since) == 0
    assert retried_requests(log) == 0

    # What clients got in the second after each rollout ended: one answer, v1's
    # (as before the first swap) after each rollback, and each swap's its own.
    [v1] = set(answers.said_between(0, started))
    after = [set(answers.said_between(at, at + 1.0)) for at, _ in ended]
    assert all(len(said) == 1 for said in after), after
    swaps = [said for said, (_, r) in zip(after, ended, strict=True) if r["kind"] != "rollback"]
    rollbacks = [said for said, (_, r) in zip(after, ended, strict=True) if r["kind"] == "rollback"]
    assert rollbacks == [{v1}] * 3, (v1, after)
    assert len(set().union(*swaps) | {v1}) == 4, (v1, after)

    # The door held requests (the gap met the hold, not luck), each for less
    # than its bound; and the first swap went: hold, drain, hold renewed for
    # the swap, ready, hold released.
    held = held_ms(log, NAME)
    assert held and max(held) < settings.SERVING_DOOR_HOLD_SECONDS * 1000, held
    changes = HttpAttempt.objects.filter(
        purpose="gateway", started_at__gte=ended[0][1]["started_at"]
    ).order_by("started_at", "id")
    steps = [_step(row.url.split(" ", 1)[1], door.held_map_path) for row in changes]
    assert steps[:5] == ["hold", "drain", "hold", "ready", "release"], steps


def _step(change: str, held_map: Path) -> str:
    if f" {held_map} " in change:
        return "release" if change.startswith("del map") else "hold"
    return change.rsplit(" ", 1)[-1]
