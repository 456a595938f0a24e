"""A real Prometheus scrapes the control plane's /metrics (the live server,
with its bearer token) and PromQL returns what happened: a promotion, a replica
going down. Replicas here are fake; tests/serving/vllm/test_prometheus_real.py
does the same with real vLLM servers scraped too."""

from __future__ import annotations

import pytest

from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.support.prometheus_server import PrometheusServer, ScrapeJob, prometheus_available

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not prometheus_available(), reason="Debian package prometheus missing"),
]
TOKEN = "prometheus-scrape-token"


@pytest.fixture
def prometheus(live_server, settings, tmp_path):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_ANONYMOUS = False
    jobs = [ScrapeJob("control-plane", [live_server.url], bearer_token=TOKEN)]
    with PrometheusServer(jobs, tmp_path) as server:
        yield server


def test_promql_sees_a_promotion_and_a_replica_going_down(
    prometheus, lena, deployment, approved_v1, fake_replicas
):
    assert prometheus.wait_for('up{job="control-plane"}', lambda v: v == 1) == 1
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == "succeeded"
    reconcile_deployment(deployment.pk, "beat")

    name = deployment.name
    rollouts = f'lora_rollouts_total{{deployment="{name}",kind="promote",outcome="succeeded"}}'
    assert prometheus.wait_for(rollouts, lambda v: v == 1) == 1
    assert prometheus.wait_for(
        f'sum(lora_replicas{{deployment="{name}",state="up"}})', lambda v: v == 2
    )
    # Scrapes are a second apart: the reconcile may land in a later one than the rollout.
    desired = f'lora_adapters_desired{{deployment="{name}"}}'
    assert prometheus.wait_for(desired, lambda v: v == 1) == 1
    loaded = f'sum(lora_adapters_loaded{{deployment="{name}"}})'
    assert prometheus.wait_for(loaded, lambda v: v == 2) == 2
    duration = f'lora_rollout_duration_seconds_count{{deployment="{name}"}}'
    assert prometheus.wait_for(duration, lambda v: v == 1) == 1
    stale = f'time() - lora_reconcile_last_success_timestamp_seconds{{deployment="{name}"}}'
    assert prometheus.wait_for(stale, lambda v: v is not None and v < 60) < 60

    fake_replicas[1].close()
    reconcile_deployment(deployment.pk, "beat")
    down = f'sum(lora_replicas{{deployment="{name}",state="down"}})'
    assert prometheus.wait_for(down, lambda v: v == 1) == 1
    drift = f'lora_drift_events_total{{deployment="{name}",kind="replica_down"}}'
    assert prometheus.wait_for(drift, lambda v: v == 1) == 1
    # The rule the LoraReplicaDown alert is written on selects it.
    assert prometheus.value('sum by (deployment) (lora_replicas{state="down"}) > 0') == 1


def test_a_wrong_token_is_a_failed_scrape(live_server, settings, tmp_path):
    settings.METRICS_TOKEN = TOKEN
    jobs = [ScrapeJob("control-plane", [live_server.url], bearer_token="wrong")]
    with PrometheusServer(jobs, tmp_path) as server:
        assert server.wait_for('up{job="control-plane"}', lambda v: v == 0) == 0
