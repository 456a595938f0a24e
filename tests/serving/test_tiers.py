"""vLLM's three tiers on a deployment (serving.capacity): limits, how their use
is known, the cold-load prediction, and how the deployment API shows them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import ReplicaLoraState
from serving.capacity import deployment_tiers
from serving.models import HttpAttempt, Replica, ServedAdapter
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


def serve(deployment, user, approver, department, name, seed):
    adapter = make_adapter(user, department, name=name)
    version = make_approved_version(user, approver, adapter, AdapterSpec(seed=seed))
    return ServedAdapter.objects.create(deployment=deployment, adapter=adapter, version=version)


def replica(deployment, url="http://a", loaded=()):
    return Replica.objects.create(
        deployment=deployment,
        base_url=url,
        loaded_adapters=[{"id": name, "root": f"/v/{name}"} for name in loaded],
    )


def lora_state(replica, *, running=(), waiting=(), gpu=None, cpu=None, ok=True):
    return ReplicaLoraState.objects.create(
        replica=replica,
        observed_at=timezone.now(),
        ok=ok,
        running=list(running),
        waiting=list(waiting),
        gpu_loaded=gpu,
        cpu_loaded=cpu,
    )


def test_a_new_deployment_registers_up_to_500_adapters(deployment):
    tiers = deployment_tiers(deployment)
    assert deployment.max_registered_adapters == 500
    assert (tiers.batch.limit, tiers.host.limit, tiers.registered.limit) == (2, 4, 500)
    assert (tiers.batch.used, tiers.host.used, tiers.registered.used) == (None, 0, 0)
    assert tiers.batch.how == "not observed: no /metrics reading"
    assert not tiers.cold_load.measured and not tiers.evicting


def test_registered_counts_every_departments_served_adapters_but_not_retired_ones(
    deployment, lena, alex, fred, root, legal, finance
):
    serve(deployment, lena, alex, legal, "contracts", 1)
    serve(deployment, fred, root, finance, "risk", 2)
    retired = serve(deployment, lena, alex, legal, "nda", 3)
    retired.version = None
    retired.save()
    assert deployment_tiers(deployment).registered.used == 2


def test_the_host_cache_is_estimated_from_what_replicas_list_up_to_max_cpu_loras(deployment):
    replica(deployment, "http://a", loaded=[f"a{i}" for i in range(6)])
    replica(deployment, "http://b", loaded=["a0", "a1"])
    host = deployment_tiers(deployment).host
    assert (host.used, host.limit) == (4, 4)
    assert host.how.startswith("estimated")


def test_the_batch_is_what_vllm_last_reported_running_on_the_busiest_replica(deployment):
    lora_state(replica(deployment, "http://a"), running=["a", "b"], waiting=["c"])
    lora_state(replica(deployment, "http://b"), running=["a"])
    # A failed scrape says nothing about what runs.
    lora_state(replica(deployment, "http://c"), running=["a", "b", "c", "d"], ok=False)
    tiers = deployment_tiers(deployment)
    assert tiers.batch.used == 2
    assert tiers.batch.how == (
        "adapters in the running batch at the last reading of vLLM's /metrics; 1 waiting for a slot"
    )


def test_newer_vllm_residency_metrics_are_read_where_exported(deployment):
    lora_state(
        replica(deployment, loaded=["a", "b", "c"]), running=["a"], gpu=["a", "b"], cpu=["c"]
    )
    tiers = deployment_tiers(deployment)
    assert (tiers.batch.used, tiers.host.used) == (2, 1)
    assert tiers.host.how == "vLLM's lora_adapter_loaded metric"


def test_above_max_cpu_loras_the_deployment_is_evicting(deployment, lena, alex, legal):
    for i in range(5):
        serve(deployment, lena, alex, legal, f"a{i}", i)
    tiers = deployment_tiers(deployment)
    assert tiers.evicting and tiers.registered.used == 5 and tiers.host.limit == 4


def test_the_deployment_api_shows_the_three_tiers_and_the_cold_load(
    as_lena, as_root, deployment, lena, alex, legal
):
    serve(deployment, lena, alex, legal, "contracts", 1)
    a = replica(deployment, loaded=["legal-contracts"])
    lora_state(a, running=["legal-contracts"])
    HttpAttempt.objects.create(
        replica=a,
        purpose="load",
        method="POST",
        url="http://a/v1/load_lora_adapter",
        started_at=timezone.now() - timedelta(minutes=1),
        duration_ms=12.0,
        status_code=200,
        ok=True,
    )
    for client in (as_lena, as_root):
        tiers = client.get(f"/api/v1/deployments/{deployment.name}/").json()["tiers"]
        listed = client.get("/api/v1/deployments/").json()["results"][0]["tiers"]
        assert tiers == listed
        assert tiers["batch"]["limit"] == 2 and tiers["batch"]["used"] == 1
        assert tiers["host"] == {
            "limit": 4,
            "used": 1,
            "how": "estimated: the adapters a replica lists, up to max_cpu_loras (LRU)",
        }
        assert tiers["registered"] == {
            "limit": 500,
            "used": 1,
            "how": "adapters promoted to this deployment",
        }
        assert tiers["evicting"] is False
        assert tiers["cold_load"]["samples"] == 1
        assert tiers["cold_load"]["median_ms"] == tiers["cold_load"]["p95_ms"] == 12.0
        assert "predicted cold-load latency 12 ms median" in tiers["cold_load"]["message"]


def test_listing_deployments_reads_the_tiers_in_a_fixed_number_of_queries(
    as_root, root, deployment, fake_replicas, tmp_path, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        assert as_root.get("/api/v1/deployments/").status_code == 200
    for i in range(3):
        extra = make_deployment(root, ["http://x"], tmp_path / f"v{i}", name=f"more-{i}")
        replica(extra, "http://x", loaded=["a"])
    with django_assert_max_num_queries(len(one)):
        assert len(as_root.get("/api/v1/deployments/").json()["results"]) == 4


def test_max_registered_adapters_below_one_is_400_naming_the_field(as_root, deployment):
    response = as_root.patch(
        f"/api/v1/deployments/{deployment.name}/", {"max_registered_adapters": 0}, format="json"
    )
    assert response.status_code == 400
    assert "max_registered_adapters" in response.content.decode()


def test_the_limit_cannot_go_below_what_the_deployment_serves(
    as_root, deployment, lena, alex, legal
):
    serve(deployment, lena, alex, legal, "contracts", 1)
    serve(deployment, lena, alex, legal, "nda", 2)
    response = as_root.patch(
        f"/api/v1/deployments/{deployment.name}/", {"max_registered_adapters": 1}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "max_registered_adapters 1 is below the 2 adapters this deployment serves: "
        "retire some first."
    )
    ok = as_root.patch(
        f"/api/v1/deployments/{deployment.name}/", {"max_registered_adapters": 2}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["tiers"]["registered"]["limit"] == 2
