"""Placement on real vLLM, behind a real HAProxy front door: 40 adapters on 2
replicas whose host caches hold 4 (max_cpu_loras 4), each adapter on exactly
one replica by placement (max_replicas 1), so each replica registers 20 instead
of 40. Every one answers through the front door, which sends it only to the
replica that holds it.

The deployment's placement_capacity (20) lets placement fill a replica past its
host cache: vLLM's LRU then re-reads evicted adapters from disk, as it does
for adapters without bounds (tests/serving/vllm/test_many_adapters_real.py)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serving.models import Deployment, ServedAdapter
from serving.placement import State
from serving.reconcile.tick import reconcile_deployment
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.vllm.conftest import adapters_on, ok
from tests.support.adapters import AdapterSpec
from tests.support.haproxy import haproxy_available, open_access, running_haproxy, vllm_404s
from tests.support.vllm_servers import free_port
from tests.support.workers import wait_rollouts_succeeded

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not haproxy_available() and os.environ.get("REQUIRE_HAPROXY") != "1",
        reason="haproxy is not installed (scripts/test.sh installs Debian's haproxy)",
    ),
]

ADAPTERS = 40


def test_forty_adapters_each_on_one_of_two_replicas_all_answer_through_the_front_door(
    platform, vllm_servers, celery_worker, lena, alex, legal, settings, tmp_path
):
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_GATEWAYS = {"placed": listen}
    settings.SERVING_GATEWAY_DIR = tmp_path / "gateways"
    platform.create_deployment(
        "placed",
        [s.base_url for s in vllm_servers],
        placement_capacity=ADAPTERS // 2,
        open_door=True,
    )
    deployment = Deployment.objects.get(name="placed")
    assert deployment.max_cpu_loras == 4
    names = []
    versions = []
    for i in range(ADAPTERS):
        adapter = make_adapter(lena, legal, name=f"p{i:02d}", served_name=f"legal-p{i:02d}")
        names.append(adapter.served_name)
        # Each on one replica, set through the API before its first promotion.
        ok(
            platform.member.put(
                "/api/v1/deployments/placed/placement/",
                {"adapter": adapter.pk, "min_replicas": None, "max_replicas": 1},
                format="json",
            )
        )
        versions.append(
            make_approved_version(lena, alex, adapter, AdapterSpec(seed=300 + i, scale=0.05))
        )

    from serving.gateway.services import front_door_for, gateway_sync

    gateway_sync(deployment)  # the configuration HAProxy starts with
    door = front_door_for(deployment)
    sizes = [s.log_path.stat().st_size if s.log_path.exists() else 0 for s in vllm_servers]
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        rollouts = []
        for version in versions:
            promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
            host = next(c for c in promotion.gate_report if c["name"] == "host_cache")
            assert host["ok"], host  # 2 x placement_capacity 20 = 40 placements: room
            rollouts.append(promotion.rollouts.get().pk)
        wait_rollouts_succeeded(rollouts, timeout=900)
        reconcile_deployment(deployment.pk, "test")  # and the front door follows it

        # Each adapter on exactly one replica, 20 each: placement, not every replica.
        held = [adapters_on(server) for server in vllm_servers]
        for name in names:
            assert sum(name in h for h in held) == 1, (name, [sorted(h) for h in held])
        assert sorted(len(h) for h in held) == [20, 20]
        for row in ServedAdapter.objects.filter(deployment=deployment):
            assert len(State.from_dict(row.placement).replicas) == 1

        url = f"http://{listen}/v1/completions"

        def ask(name: str) -> int:
            body = {"model": name, "prompt": "The contract says", "max_tokens": 1}
            return requests.post(url, json=body, timeout=120).status_code

        with ThreadPoolExecutor(max_workers=4) as pool:
            statuses = dict(zip(names, pool.map(ask, names), strict=True))
        assert set(statuses.values()) == {200}, statuses
        # The front door sent each request only where its adapter was: vLLM
        # answered no completion with a 404 for an adapter it lacked.
        for server, since in zip(vllm_servers, sizes, strict=True):
            assert vllm_404s(server.log_path, since) == 0

    placement = ok(platform.member.get("/api/v1/deployments/placed/placement/"))
    assert len(placement) == ADAPTERS
    assert {row["reason"] for row in placement} == {"min"}
    assert all(len(row["replicas"]) == 1 for row in placement)
