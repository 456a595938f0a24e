"""Reconcile against fake replicas (error paths); the restart case is also
shown against real vLLM in tests/serving/vllm/."""

import pytest

from serving.models import DriftEvent, Replica
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(lena, deployment, approved_v1):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    return rollout.served_path


def kinds():
    return sorted(DriftEvent.objects.values_list("kind", flat=True))


def test_in_sync_means_one_models_call_per_replica_and_no_repairs(
    deployment, served, fake_replicas
):
    for replica in fake_replicas:
        replica.requests.clear()
    report = reconcile_deployment(deployment.pk, "beat")
    assert report.repairs == []
    for replica in fake_replicas:
        # The listing, then the tick's one read of /metrics (its max_lora, and
        # what observability records: tests/observability/), then one probe of
        # the adapter's weights against its fingerprint (the sample,
        # tests/serving/test_fingerprints.py).
        assert [p for _, p, _ in replica.requests] == [
            "/v1/models",
            "/metrics",
            "/v1/completions",
        ]
    assert kinds() == []


def test_a_restarted_replica_gets_its_adapters_back(deployment, served, fake_replicas):
    fake_replicas[0].restart()
    report = reconcile_deployment(deployment.pk, "beat")
    assert fake_replicas[0].adapters == {"legal-contracts": served}
    assert len(report.repairs) == 1
    event = DriftEvent.objects.get()
    assert event.kind == "missing_reloaded" and event.expected_root == served


def test_a_wrong_root_is_corrected(deployment, served, fake_replicas):
    fake_replicas[1].adapters["legal-contracts"] = "/somewhere/else"
    reconcile_deployment(deployment.pk, "beat")
    assert fake_replicas[1].adapters["legal-contracts"] == served
    event = DriftEvent.objects.get()
    assert event.kind == "wrong_root_corrected" and event.actual_root == "/somewhere/else"


def test_unknown_adapters_are_reported_once(deployment, served, fake_replicas):
    fake_replicas[0].adapters["stray"] = "/tmp/stray"
    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")
    assert kinds() == ["unknown_reported"]
    assert "stray" in fake_replicas[0].adapters


def test_unknown_adapters_are_unloaded_when_policy_says_so(deployment, served, fake_replicas):
    deployment.unload_unknown_adapters = True
    deployment.save()
    fake_replicas[0].adapters["stray"] = "/tmp/stray"
    reconcile_deployment(deployment.pk, "beat")
    assert "stray" not in fake_replicas[0].adapters
    assert kinds() == ["unknown_unloaded"]


def test_replica_health_is_recorded(deployment, served, fake_replicas):
    fake_replicas[0].unavailable = 10
    reconcile_deployment(deployment.pk, "beat")
    replica = Replica.objects.get(base_url=fake_replicas[0].base_url)
    assert replica.health == "down" and "Service Unavailable" in replica.last_error
    assert "replica_down" in kinds()
    fake_replicas[0].unavailable = 0
    reconcile_deployment(deployment.pk, "beat")
    replica.refresh_from_db()
    assert replica.health == "up"
    assert "replica_up" in kinds()


def test_a_second_reconciler_skips_a_deployment_in_progress(deployment, served):
    from serving.records.leases import deployment_reconcile_claim

    assert deployment_reconcile_claim(deployment.pk, "other")
    assert reconcile_deployment(deployment.pk, "beat").skipped


def test_reconcile_leaves_an_adapter_alone_while_a_rollout_holds_it(
    deployment, served, fake_replicas
):
    from serving.models import ServedAdapter
    from serving.records.leases import served_adapter_claim

    fake_replicas[0].restart()
    assert served_adapter_claim(ServedAdapter.objects.get().pk, "rollout-worker")
    reconcile_deployment(deployment.pk, "beat")
    assert fake_replicas[0].adapters == {}


def test_a_replica_added_later_gets_the_adapters(deployment, served, fake_replicas):
    from tests.support.vllm_standin import serve_standin

    newcomer = serve_standin()
    try:
        deployment.replica_urls = [*deployment.replica_urls, newcomer.base_url]
        deployment.save()
        reconcile_deployment(deployment.pk, "beat")
        assert newcomer.adapters == {"legal-contracts": served}
    finally:
        newcomer.close()


def test_retired_adapters_are_unloaded(lena, deployment, served, fake_replicas, approved_v1):
    from serving.models import ServedAdapter

    ServedAdapter.objects.update(version=None, served_path="")
    reconcile_deployment(deployment.pk, "beat")
    assert all("legal-contracts" not in r.adapters for r in fake_replicas)
    assert kinds() == ["retired_unloaded", "retired_unloaded"]


def test_replicas_another_worker_just_discovered_are_taken_not_created_twice(deployment):
    """Two first rollouts of a deployment (a burst of promotions) sync its replicas
    at once: each read the replicas before the other created them."""
    from serving.models import Deployment, Replica
    from serving.replica_rows import replicas_sync

    stale = Deployment.objects.prefetch_related("replicas").get(pk=deployment.pk)
    assert list(stale.replicas.all()) == []
    first = replicas_sync(Deployment.objects.get(pk=deployment.pk))

    second = replicas_sync(stale)

    assert [r.pk for r in second] == [r.pk for r in first]
    assert Replica.objects.filter(deployment=deployment).count() == len(first) == 2


def test_dns_discovery_makes_one_replica_per_a_record(deployment, monkeypatch):
    import socket

    from serving.replica_rows import replicas_sync

    def fake_getaddrinfo(host, port, family, kind):
        assert host == "vllm-headless.ml.svc.cluster.local" and port == 8000
        return [(family, kind, 6, "", (ip, port)) for ip in ("10.0.0.7", "10.0.0.5", "10.0.0.7")]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    deployment.replica_urls = []
    deployment.replica_dns_name = "vllm-headless.ml.svc.cluster.local"
    deployment.save()

    urls = [r.base_url for r in replicas_sync(deployment)]

    assert urls == ["http://10.0.0.5:8000", "http://10.0.0.7:8000"]
