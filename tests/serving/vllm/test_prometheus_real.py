"""A real Prometheus scrapes the control plane (live server, bearer token) and
two real vLLM servers. After a promotion through the product and one request
through the adapter, PromQL sees the rollout, the adapters loaded, when the
adapter was last active (read by the reconcile from vLLM's own /metrics), and
vLLM's series; after a replica goes down, both the control plane's count and
Prometheus's own `up` say so. The second replica is reached through a
byte-for-byte relay (TcpProxy, tests/support/processes.py) that stops listening
and cuts its connections to take it down: what the control plane and
Prometheus see of a stopped server (connection refused), without a vLLM start
to bring it back for the next test."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from observability.models import AdapterActivity
from serving.models import Deployment
from serving.reconcile.tick import reconcile_deployment
from tests.serving.vllm.conftest import chat_through_openai
from tests.support.adapters import AdapterSpec
from tests.support.processes import TcpProxy
from tests.support.prometheus_server import PrometheusServer, ScrapeJob, prometheus_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not prometheus_available(), reason="Debian package prometheus missing"),
]
TOKEN = "prometheus-scrape-token"


def test_promql_after_a_promotion_and_a_replica_going_down(
    platform, vllm_servers, celery_worker, live_server, settings, tmp_path, request
):
    settings.METRICS_TOKEN = TOKEN
    a, behind_b = vllm_servers
    b = TcpProxy.in_front_of(behind_b.base_url)
    request.addfinalizer(b.close)
    platform.create_deployment("staging-cpu", [a.base_url, b.url])
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    jobs = [
        ScrapeJob("control-plane", [live_server.url], bearer_token=TOKEN),
        ScrapeJob("vllm", [a.base_url, b.url]),
    ]
    with PrometheusServer(jobs, tmp_path) as prometheus:
        started = time.time()
        assert platform.promote_and_wait("staging-cpu", v1["id"])["status"] == "succeeded"
        deployment = Deployment.objects.get(name="staging-cpu")
        # A replica's first /metrics read is a baseline, and activity within the
        # grace after the rollout's own probes is theirs, not a client's
        # (serving/records/own_probes.py): a reconcile first, then a client
        # request past a short grace.
        settings.SERVING_OWN_PROBE_GRACE_SECONDS = 1.0
        reconcile_deployment(deployment.pk, "test")
        time.sleep(1.5)
        chat_through_openai(a.base_url, "legal-contracts")
        reconcile_deployment(deployment.pk, "test")
        activity = AdapterActivity.objects.get(served_name="legal-contracts")
        assert activity.last_active_at.timestamp() >= started

        rollouts = 'lora_rollouts_total{deployment="staging-cpu",outcome="succeeded"}'
        assert prometheus.wait_for(rollouts, lambda v: v == 1, timeout=60) == 1
        loaded = 'sum(lora_adapters_loaded{deployment="staging-cpu"})'
        assert prometheus.wait_for(loaded, lambda v: v == 2) == 2
        active = 'lora_adapter_last_active_timestamp_seconds{adapter="legal-contracts"}'
        assert prometheus.wait_for(active, lambda v: v is not None and v >= started) >= started
        # vLLM's own series, scraped from the real servers.
        assert prometheus.wait_for('sum(up{job="vllm"})', lambda v: v == 2) == 2
        info = 'count(vllm:lora_requests_info{job="vllm",max_lora="2"})'
        assert prometheus.wait_for(info, lambda v: v is not None and v >= 1) >= 1

        b.go_down()
        reconcile_deployment(deployment.pk, "test")
        down = 'sum(lora_replicas{deployment="staging-cpu",state="down"})'
        assert prometheus.wait_for(down, lambda v: v == 1) == 1
        instance = urlsplit(b.url).netloc
        assert prometheus.wait_for(f'up{{job="vllm",instance="{instance}"}}', lambda v: v == 0) == 0
        assert prometheus.value('sum(lora_replicas{state="up"})') == 1
