"""GET /metrics: who may scrape, and what a scrape says after real rollouts and
reconciles against fake replicas. The same figures are read by a real
Prometheus in test_prometheus.py."""

import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from serving.capacity import deployment_shape
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.rules.planner import lora_pool_bytes
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.observability.conftest import lora_info, read_before
from tests.serving.conftest import make_deployment
from tests.support.vllm_standin import serve_standin

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests"


@pytest.fixture
def metrics_token(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_ANONYMOUS = False


def scrape(token: str = TOKEN) -> dict[tuple[str, frozenset], float]:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


# -- who may scrape -------------------------------------------------------------------


def test_metrics_are_off_without_a_token_or_anonymous_access(settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_ANONYMOUS = False
    assert Client().get("/metrics").status_code == 404


def test_a_missing_or_wrong_token_is_401(metrics_token):
    missing = Client().get("/metrics")
    assert missing.status_code == 401 and missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x")
    assert wrong.status_code == 401
    basic = Client().get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")
    assert basic.status_code == 401
    assert b"lora_" not in missing.content + wrong.content + basic.content


def test_the_token_opens_the_metrics(metrics_token):
    assert value(scrape(), "lora_pending_reviews", kind="version") == 0


def test_anonymous_access_where_configured(settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_ANONYMOUS = True
    response = Client().get("/metrics")
    assert response.status_code == 200 and b"lora_replicas" in response.content


def test_only_get(metrics_token):
    assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


# -- what a scrape says --------------------------------------------------------------------


@pytest.fixture
def rolled_out(lena, deployment, approved_v1, fake_replicas):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"
    now = time.time()
    read_before(deployment, now - 60)
    fake_replicas[0].metrics_text = lora_info(("legal-contracts", "", now - 2))
    fake_replicas[1].metrics_text = lora_info(("", "", now - 1))
    reconcile_deployment(deployment.pk, "beat")
    return now - 2


def test_a_scrape_after_a_promotion_and_a_reconcile(
    metrics_token, deployment, rolled_out, fake_replicas
):
    s = scrape()
    name = deployment.name
    rollout = {"deployment": name, "kind": "promote", "outcome": "succeeded"}
    assert value(s, "lora_rollouts_total", **rollout) == 1
    assert value(s, "lora_rollout_duration_seconds_count", **rollout) == 1
    assert value(s, "lora_rollout_duration_seconds_bucket", **rollout, le="+Inf") == 1
    assert value(s, "lora_rollout_phase_duration_seconds_count", phase="load") == 2
    assert value(s, "lora_rollout_phase_duration_seconds_count", phase="verify") == 2
    assert value(s, "lora_rollouts_in_progress", deployment=name) == 0
    attempt = {"deployment": name, "status": "200"}
    assert value(s, "lora_vllm_http_attempts_total", purpose="load", **attempt) == 2
    assert value(s, "lora_vllm_http_attempts_total", purpose="reconcile_models", **attempt) == 2
    # read_before's read and the reconcile's, on each of the 2 replicas.
    assert value(s, "lora_vllm_http_attempts_total", purpose="metrics", **attempt) == 4
    assert value(s, "lora_reconcile_runs_total", deployment=name, outcome="ok") == 1
    assert value(s, "lora_reconcile_duration_seconds_count", deployment=name) == 1
    assert (
        value(s, "lora_reconcile_last_success_timestamp_seconds", deployment=name)
        > time.time() - 60
    )
    assert value(s, "lora_replicas", deployment=name, state="up") == 2
    assert value(s, "lora_replicas", deployment=name, state="down") == 0
    assert value(s, "lora_adapters_desired", deployment=name) == 1
    for replica in fake_replicas:
        assert value(s, "lora_adapters_loaded", deployment=name, replica=replica.base_url) == 1
        assert value(s, "lora_adapters_missing", deployment=name, replica=replica.base_url) == 0
    assert value(s, "lora_versions", department="legal", status="approved") == 1
    adapter = {"deployment": name, "adapter": "legal-contracts"}
    assert value(s, "lora_adapter_last_active_timestamp_seconds", **adapter) == pytest.approx(
        rolled_out
    )
    assert value(s, "lora_adapter_active_samples_total", **adapter) == 1
    assert value(s, "lora_adapter_idle", **adapter) == 0
    first = {"deployment": name, "replica": fake_replicas[0].base_url}
    assert value(s, "lora_vllm_running_adapters", **first) == 1
    assert value(s, "lora_vllm_max_loras", **first) == 2
    expected_pool = lora_pool_bytes(deployment_shape(deployment), 2, 16)
    assert value(s, "lora_pool_bytes", deployment=name) == expected_pool


def test_drift_and_a_replica_going_down_show(metrics_token, deployment, rolled_out, fake_replicas):
    fake_replicas[0].restart()  # forgets the adapter: reconcile reloads it
    # A restarted vLLM has no LoRA record until its first step; the fixture's
    # record (the adapter running) would otherwise hold the reload back.
    fake_replicas[0].metrics_text = None
    reconcile_deployment(deployment.pk, "beat")
    fake_replicas[1].close()
    reconcile_deployment(deployment.pk, "beat")
    s = scrape()
    name = deployment.name
    assert value(s, "lora_drift_events_total", deployment=name, kind="missing_reloaded") == 1
    assert value(s, "lora_drift_events_total", deployment=name, kind="replica_down") == 1
    assert value(s, "lora_replicas", deployment=name, state="down") == 1
    assert (
        value(
            s,
            "lora_vllm_http_attempts_total",
            deployment=name,
            purpose="reconcile_models",
            status="error",
        )
        == 1
    )


def test_a_failed_rollout_is_counted_by_its_outcome(
    metrics_token, lena, alex, deployment, contracts, fake_replicas
):
    from tests.factories import make_approved_version
    from tests.support.adapters import AdapterSpec

    fake_replicas[1].fail_load = (500, "engine error")
    version = make_approved_version(lena, alex, contracts, AdapterSpec(seed=5))
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
    outcome = rollout_execute(promotion.rollouts.get().pk, "w")
    s = scrape()
    labels = {"deployment": deployment.name, "kind": "promote", "outcome": outcome}
    assert outcome in ("failed", "rolled_back")
    assert value(s, "lora_rollouts_total", **labels) == 1
    assert (
        value(
            s,
            "lora_vllm_http_attempts_total",
            deployment=deployment.name,
            purpose="load",
            status="500",
        )
        >= 1
    )


def test_a_scrape_costs_the_same_queries_however_much_there_is(
    metrics_token, root, deployment, rolled_out, tmp_path
):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            scrape()
        return len(captured)

    few = queries()
    extra = [serve_standin() for _ in range(3)]
    try:
        for i, fake in enumerate(extra):
            other = make_deployment(root, [fake.base_url], tmp_path / f"v{i}", name=f"more-{i}")
            fake.metrics_text = lora_info(("x,y", "", time.time()))
            reconcile_deployment(other.pk, "beat")
        assert queries() == few
    finally:
        for fake in extra:
            fake.close()


def test_mirror_lag_is_the_age_of_the_oldest_unsynced_change(metrics_token, approved_v1):
    from datetime import timedelta

    from django.utils import timezone

    from mlflow_bridge.models import MlflowVersionMirror

    assert value(scrape(), "lora_mlflow_mirror_lag_seconds", kind="version") == 0
    row = MlflowVersionMirror.objects.create(version=approved_v1, state="failed")
    MlflowVersionMirror.objects.filter(pk=row.pk).update(
        updated_at=timezone.now() - timedelta(seconds=600)
    )
    s = scrape()
    assert 600 <= value(s, "lora_mlflow_mirror_lag_seconds", kind="version") < 660
    assert value(s, "lora_mlflow_mirror_backlog", kind="version", state="failed") == 1
    assert value(s, "lora_mlflow_mirror_backlog", kind="alias", state="pending") == 0
    MlflowVersionMirror.objects.filter(pk=row.pk).update(state="synced")
    assert value(scrape(), "lora_mlflow_mirror_lag_seconds", kind="version") == 0
