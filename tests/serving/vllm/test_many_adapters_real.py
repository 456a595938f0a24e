"""vLLM's third tier on real servers: 60 adapters promoted to a deployment whose
replicas cache 4 in host memory (max_cpu_loras 4, max_loras 2). The gate lets
every one through and says what the evicted ones cost; each answers a
completion, the evicted ones after vLLM re-reads them from their lora_path.

Versions are registered in-process (the REST upload is tested elsewhere), with
weights large enough that verification sees their effect (at the default scale
an occasional seed moves the probe by less than its tolerance), and
promoted through promotion_create; the rollouts run on the real Celery worker."""

from __future__ import annotations

import statistics
import time

import pytest

from serving.capacity import deployment_tiers
from serving.models import Deployment, HttpAttempt
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.vllm.conftest import SERVED_BASE, adapters_on
from tests.support.adapters import AdapterSpec
from tests.support.workers import wait_rollouts_succeeded

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

ADAPTERS = 60
PROMPT = "The contract says"


def _promote(lena, deployment, version):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
    host_cache = next(c for c in promotion.gate_report if c["name"] == "host_cache")
    return promotion.rollouts.get(), host_cache


def _completion_ms(client, model: str) -> float:
    answer = client.probe(model, prompt=PROMPT, max_tokens=1)
    assert answer.status_code == 200, (model, answer.status_code, answer.error)
    return answer.duration_ms


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def test_sixty_adapters_over_max_cpu_loras_four_all_answer(
    platform, vllm_servers, celery_worker, lena, alex, legal, record_property
):
    started = time.monotonic()
    platform.create_deployment("many", [server.base_url for server in vllm_servers])
    deployment = Deployment.objects.get(name="many")
    assert (deployment.max_loras, deployment.max_cpu_loras) == (2, 4)
    assert deployment.max_registered_adapters == 500
    versions = []
    for i in range(ADAPTERS):
        adapter = make_adapter(lena, legal, name=f"a{i:02d}", served_name=f"legal-a{i:02d}")
        versions.append(
            make_approved_version(lena, alex, adapter, AdapterSpec(seed=100 + i, scale=0.05))
        )

    # The host cache's worth first, so that the gate has loads to predict from.
    first = [_promote(lena, deployment, v) for v in versions[:4]]
    assert all(check["ok"] for _, check in first), [c for _, c in first]
    wait_rollouts_succeeded([r.pk for r, _ in first], timeout=120)
    rest = [_promote(lena, deployment, v) for v in versions[4:]]
    # Above max_cpu_loras the gate passes, with the cost in words.
    fifth = rest[0][1]
    assert not fifth["ok"] and fifth["advisory"], fifth
    assert "5 adapters registered, 4 cached in host memory" in fifth["message"]
    assert "predicted cold-load latency" in fifth["message"]
    assert "from the 8 most recent successful loads" in fifth["message"]
    # Promotions in a burst count each other's rollouts still under way.
    assert f"{ADAPTERS} adapters registered" in rest[-1][1]["message"]
    wait_rollouts_succeeded([r.pk for r, _ in rest], timeout=240)
    promoted_at = time.monotonic()

    names = [v.adapter.served_name for v in versions]
    for server in vllm_servers:
        assert set(adapters_on(server)) == set(names)

    # In promotion order: each request's adapter was evicted by the 4 after it, and
    # loading it evicts the least recently used, so every first request is cold.
    cold, warm, base = [], [], []
    replica_a, replica_b = vllm_servers
    with replica_a.client(timeout=60) as client:
        for name in names:
            base.append(_completion_ms(client, SERVED_BASE))
            cold.append(_completion_ms(client, name))
            warm.append(_completion_ms(client, name))
    # Every adapter answers on the other replica too (cold there as well).
    with replica_b.client(timeout=60) as client:
        for name in names:
            _completion_ms(client, name)

    loads = list(
        HttpAttempt.objects.filter(
            replica__deployment=deployment, purpose="load", ok=True
        ).values_list("duration_ms", flat=True)
    )
    assert len(loads) == 2 * ADAPTERS
    tiers = deployment_tiers(deployment)
    assert tiers.registered.used == ADAPTERS and tiers.registered.limit == 500
    assert tiers.host.limit == 4 and tiers.batch.limit == 2
    assert tiers.evicting
    figures = {
        "cold_median_ms": statistics.median(cold),
        "cold_p95_ms": _p95(cold),
        "warm_median_ms": statistics.median(warm),
        "warm_p95_ms": _p95(warm),
        "base_median_ms": statistics.median(base),
        "base_p95_ms": _p95(base),
        "predicted_median_ms": tiers.cold_load.median_ms,
        "predicted_p95_ms": tiers.cold_load.p95_ms,
        "setup_and_promotion_s": promoted_at - started,
        "total_s": time.monotonic() - started,
    }
    for key, value in figures.items():
        record_property(key, round(value, 1))
    print("\n[many-adapters] " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    # A cold request pays the re-read from disk on top of what a warm one costs;
    # paired per adapter, so that the machine's load drifting in between cancels out.
    assert statistics.median(c - w for c, w in zip(cold, warm, strict=True)) > 0, figures
