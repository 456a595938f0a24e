"""Placement on real vLLM, behind a real HAProxy front door.

- 300 adapters on 2 replicas whose host caches hold 4 (max_cpu_loras 4), each
  on exactly one replica by placement (max_replicas 1), so each replica
  registers 150 instead of 300. Every one answers through the front door, which
  sends it only to the replica that holds it, with that adapter's own answer
  (its fingerprint, recorded when its rollout verified it). The deployment's
  placement_capacity (150) lets placement fill a replica past its host cache:
  vLLM's LRU then re-reads evicted adapters from disk, as it does for adapters
  without bounds (tests/serving/vllm/test_many_adapters_real.py).
- Demand: real traffic through the door on one adapter (min 1, max 2 replicas)
  shows in the real replica's /metrics as observability reads it after each
  reconcile tick; placement gives the adapter its second replica, the reconcile
  loads it there and the door sends it traffic there too; once the traffic
  stops and the quiet period has passed, placement takes the second copy back.

Cheap on purpose (the suite's time budget): versions registered in-process,
rank-1 adapters of the tiny model, promotions in-process, the rollouts run as
the product runs them (the real Celery worker), and the door's requests
answered concurrently. Each test prints where its time went.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.conf import settings as django_settings

from serving.models import Deployment, Replica, ServedAdapter, VersionFingerprint
from serving.reconcile.tick import reconcile_deployment
from serving.rules.placement_plan import State
from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version, make_approved_versions_bulk
from tests.serving.vllm.conftest import adapters_on, ok, wait_until
from tests.support.adapters import AdapterSpec
from tests.support.haproxy import (
    needs_haproxy,
    open_access,
    requests_by_server,
    running_haproxy,
    vllm_404s,
)
from tests.support.vllm_servers import free_port
from tests.support.workers import wait_rollouts_succeeded

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    needs_haproxy,
]

ADAPTERS = 300


@pytest.fixture
def worker_threads() -> int:
    # Hundreds of rollouts: more at once keep both replicas busy (each waits
    # on vLLM most of its time).
    return 4


def _spec(seed: int) -> AdapterSpec:
    # Rank 1, the smallest adapter vLLM loads; scaled so that the probe sees its
    # effect (verification fails an adapter that answers like the base model).
    return AdapterSpec(r=1, lora_alpha=2, seed=seed, scale=0.2)


class Clock:
    """Where a test's time goes: seconds per phase, printed and recorded."""

    def __init__(self, record_property):
        self.record_property = record_property
        self.started = self.last = time.monotonic()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = now - self.last
        self.last = now

    def report(self, label: str) -> None:
        self.phases["total"] = time.monotonic() - self.started
        for key, value in self.phases.items():
            self.record_property(f"{key}_s", round(value, 1))
        print(f"\n[{label}] " + " ".join(f"{k}={v:.1f}s" for k, v in self.phases.items()))


def _door(deployment: Deployment, settings, tmp_path) -> str:
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {deployment.name: listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    return listen


def _ask(url: str, name: str, *, timeout: float = 120) -> tuple[int, Probe | None]:
    """The verification probe through the door: status, and the answer's probe."""
    body = {
        "model": name,
        "prompt": PROBE_PROMPT,
        "max_tokens": PROBE_TOKENS,
        "temperature": 0,
        "logprobs": 1,
    }
    response = requests.post(url, json=body, timeout=timeout)
    if response.status_code != 200:
        return response.status_code, None
    answer = response.json()
    assert answer.get("model") == name, (name, answer.get("model"))
    return 200, Probe.from_body(answer)


def test_three_hundred_adapters_each_on_one_of_two_replicas_all_answer_through_the_door(
    platform, vllm_servers, celery_worker, lena, alex, legal, settings, tmp_path, record_property
):
    clock = Clock(record_property)
    platform.create_deployment(
        "placed",
        [s.base_url for s in vllm_servers],
        placement_capacity=ADAPTERS // 2,
        open_door=True,
    )
    deployment = Deployment.objects.get(name="placed")
    assert deployment.max_cpu_loras == 4
    listen = _door(deployment, settings, tmp_path)
    # Each on one replica, set before its first promotion (the service and the
    # REST call that set it: tests/serving/test_placement.py).
    versions = make_approved_versions_bulk(
        lena, alex, legal, [_spec(3000 + i) for i in range(ADAPTERS)], prefix="p"
    )
    ServedAdapter.objects.bulk_create(
        ServedAdapter(deployment=deployment, adapter=v.adapter, max_replicas=1) for v in versions
    )
    names = [v.adapter.served_name for v in versions]
    who = actor(lena)
    clock.lap("register")

    from serving.door.services import door_sync, front_door_for

    door_sync(deployment)  # the configuration HAProxy starts with
    door = front_door_for(deployment)
    sizes = [s.log_path.stat().st_size if s.log_path.exists() else 0 for s in vllm_servers]
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        rollouts = []
        for version in versions:
            promotion = promotion_create(actor=who, deployment=deployment, version=version)
            host = next(c for c in promotion.gate_report if c["name"] == "host_cache")
            assert host["ok"], host  # 2 x placement_capacity 150 = 300 placements: room
            rollouts.append(promotion.rollouts.get().pk)
        clock.lap("promote")
        wait_rollouts_succeeded(rollouts, timeout=900)
        clock.lap("rollouts")
        reconcile_deployment(deployment.pk, "test")  # and the front door follows it
        clock.lap("reconcile")

        # Each adapter on exactly one replica, 150 each: placement, not every replica.
        held = [adapters_on(server) for server in vllm_servers]
        for name in names:
            assert sum(name in h for h in held) == 1, (name, [sorted(h) for h in held])
        assert sorted(len(h) for h in held) == [ADAPTERS // 2, ADAPTERS // 2]
        rows = ServedAdapter.objects.filter(deployment=deployment)
        assert rows.count() == ADAPTERS
        for row in rows:
            assert len(State.from_dict(row.placement).replicas) == 1

        # Each adapter's own answer: what its rollout's verification recorded.
        expected = {
            f.version.adapter.served_name: Probe.from_dict(f.probe)
            for f in VersionFingerprint.objects.filter(deployment=deployment).select_related(
                "version__adapter"
            )
        }
        assert set(expected) == set(names)
        url = f"http://{listen}/v1/completions"
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = dict(zip(names, pool.map(lambda n: _ask(url, n), names), strict=True))
        clock.lap("answer")
        assert {status for status, _ in answers.values()} == {200}, answers
        tolerance = django_settings.SERVING_FINGERPRINT_TOLERANCE
        wrong = {
            name: probe
            for name, (_, probe) in answers.items()
            if probe is None or probe.distance(expected[name]) > tolerance
        }
        assert not wrong, wrong
        # The front door sent each request only where its adapter was: vLLM
        # answered no completion with a 404 for an adapter it lacked.
        for server, since in zip(vllm_servers, sizes, strict=True):
            assert vllm_404s(server.log_path, since) == 0

    placement = ok(platform.member.get("/api/v1/deployments/placed/placement/"))
    assert len(placement) == ADAPTERS
    assert {row["reason"] for row in placement} == {"min"}
    assert all(len(row["replicas"]) == 1 for row in placement)
    clock.report("placement-300")


QUIET = 8.0


def test_traffic_on_one_adapter_gives_it_a_second_replica_and_the_quiet_period_takes_it_back(
    platform, vllm_servers, celery_worker, lena, alex, legal, settings, tmp_path, record_property
):
    clock = Clock(record_property)
    # Short windows for the test: demand as read (no smoothing), one replica per
    # half a unit (a replica listing the adapter running is one unit: traffic
    # on its one replica asks for two), and a quiet period of seconds.
    settings.SERVING_PLACEMENT_WINDOW_SECONDS = 0
    settings.SERVING_PLACEMENT_DEMAND_PER_REPLICA = 0.5
    settings.SERVING_PLACEMENT_QUIET_SECONDS = QUIET
    settings.SERVING_DOOR_DRAIN_SECONDS = 5.0
    assert settings.OBSERVABILITY_VLLM_METRICS  # how demand is read: after each tick
    platform.create_deployment("hot", [s.base_url for s in vllm_servers], open_door=True)
    deployment = Deployment.objects.get(name="hot")
    listen = _door(deployment, settings, tmp_path)
    hot = make_adapter(lena, legal, name="hot", served_name="legal-hot")
    ok(
        platform.member.put(
            "/api/v1/deployments/hot/placement/",
            {"adapter": hot.pk, "min_replicas": 1, "max_replicas": 2},
            format="json",
        )
    )
    version = make_approved_version(lena, alex, hot, _spec(7000))

    def replica(url: str) -> Replica:  # the rows are made by the first rollout
        return Replica.objects.get(deployment=deployment, base_url=url, active=True)

    def demand() -> dict[str, dict]:
        return {r.base_url: r.lora_demand for r in Replica.objects.filter(deployment=deployment)}

    def holders() -> list[str]:
        return [s.base_url for s in vllm_servers if "legal-hot" in adapters_on(s)]

    def placed() -> list[int]:
        row = ServedAdapter.objects.get(deployment=deployment, adapter=hot)
        return sorted(State.from_dict(row.placement).replicas)

    def tick() -> None:
        report = reconcile_deployment(deployment.pk, "test")
        assert not report.skipped, report

    from serving.door.services import door_sync, front_door_for

    door_sync(deployment)
    door = front_door_for(deployment)
    log = tmp_path / "haproxy.log"
    url = f"http://{listen}/v1/completions"
    with running_haproxy(door, log=log, access=open_access()):
        promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
        wait_rollouts_succeeded([promotion.rollouts.get().pk], timeout=120)
        clock.lap("promote")
        # The baseline: no clients, so on one replica from the start and no
        # demand on any tick. The rollout's own verification probes show in
        # vLLM's /metrics as if a client had asked; they (and any placed copy's
        # verification) must never count, and a first read is only a baseline.
        seen: list[tuple[list[str], dict, list[int]]] = []
        for _ in range(3):
            tick()
            seen.append((holders(), demand(), placed()))
        print(f"\n[placement-demand] baseline ticks: {seen}")
        assert all(len(on) == 1 and len(where) == 1 for on, _, where in seen), seen
        assert not any("legal-hot" in d for _, by_url, _ in seen for d in by_url.values()), seen
        [home] = holders()
        other = next(s.base_url for s in vllm_servers if s.base_url != home)
        assert placed() == [replica(home).pk]
        clock.lap("baseline")

        # Clients: two at a time through the door, until told to stop.
        statuses: list[int] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                statuses.append(_ask(url, "legal-hot", timeout=60)[0])

        threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            # The reconcile reads the demand after a tick and places by it on
            # the next: the second replica loads the adapter, verified.
            wait_until(
                lambda: tick() or len(holders()) == 2,
                timeout=90,
                interval=0.5,
                message="the busy adapter never got its second replica",
            )
            assert placed() == sorted(replica(s.base_url).pk for s in vllm_servers)
            clock.lap("scale_up")
            busy = demand()
            # The door sends the traffic to both now.
            wait_until(
                lambda: _served_by(log, replica(other)) > 0,
                timeout=30,
                interval=0.5,
                message="the door never sent the busy adapter to its second replica",
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
        assert statuses and set(statuses) == {200}, statuses
        assert busy[home].get("legal-hot"), busy  # read from the real replica's /metrics

        # No clients: once the quiet period has passed, placement takes the
        # second copy back, and the door drains it before it is unloaded.
        quiet_from = time.monotonic()
        wait_until(
            lambda: tick() or len(holders()) == 1,
            timeout=QUIET + 90,
            interval=0.5,
            message="the quiet period never took the second replica back",
        )
        assert time.monotonic() - quiet_from >= QUIET
        assert holders() == [home] and placed() == [replica(home).pk]
        clock.lap("scale_down")
        # Still answering, from the replica that kept it.
        sizes = [s.log_path.stat().st_size for s in vllm_servers]
        with ThreadPoolExecutor(max_workers=2) as pool:
            after = list(pool.map(lambda _: _ask(url, "legal-hot")[0], range(6)))
        assert after == [200] * 6
        for server, since in zip(vllm_servers, sizes, strict=True):
            assert vllm_404s(server.log_path, since) == 0
    clock.report("placement-demand")


def _served_by(log, replica) -> int:
    """Requests the door sent to `replica` that it answered 200."""
    from serving.door.routing import server_name

    return sum(
        n
        for (_, server, status), n in requests_by_server(log).items()
        if server == server_name(replica.pk) and status == 200
    )
