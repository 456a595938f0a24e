"""A replica already down when a rollout starts does not hold it up: the
rollout serves the replicas that are up, and when the replica is back the
reconcile loads and verifies the version there. The replica that is down is a
real vLLM server behind a byte-for-byte relay (TcpProxy,
tests/support/processes.py) that stops listening and cuts its connections:
connection refused, as from a stopped server, and no vLLM start spent bringing
it back."""

from __future__ import annotations

import time

import pytest

from serving.models import Deployment
from serving.reconcile.tick import reconcile_deployment
from tests.serving.vllm.conftest import adapters_on, chat_through_openai, ok
from tests.support.adapters import AdapterSpec
from tests.support.processes import TcpProxy

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


def test_a_replica_down_before_the_rollout_is_deferred_then_finished_by_the_reconcile(
    platform, vllm_servers, celery_worker, settings, request
):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 90.0
    up, behind = vllm_servers
    down = TcpProxy.in_front_of(behind.base_url)
    request.addfinalizer(down.close)
    platform.create_deployment("staging-cpu", [up.base_url, down.url])
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    deployment = Deployment.objects.get(name="staging-cpu")

    down.go_down()
    reconcile_deployment(deployment.pk, "beat")  # finds it down
    started = time.monotonic()
    promotion = ok(platform.promote("staging-cpu", v1["id"]), 201)
    rollout = platform.wait_rollout(promotion["rollout"], timeout=120)
    took = time.monotonic() - started

    assert rollout["status"] == "succeeded", rollout["error"]
    assert took < 60, f"waited {took:.0f} s: the down replica held the rollout up"
    assert rollout["replicas_summary"]["text"] == "1 of 2 replicas serve v1, 1 deferred (down)"
    assert adapters_on(up) == {"legal-contracts": rollout["served_path"]}
    steps = {step["base_url"]: step for step in rollout["replicas"]}
    assert steps[down.url]["status"] == "deferred"
    assert steps[down.url]["attempts"] == []

    down.come_up()
    reconcile_deployment(deployment.pk, "beat")

    rollout = platform.rollout(rollout["id"])
    assert rollout["replicas_summary"]["text"] == "2 of 2 replicas serve v1"
    assert adapters_on(behind) == {"legal-contracts": rollout["served_path"]}
    chat_through_openai(behind.base_url, "legal-contracts")
    step = {step["base_url"]: step for step in rollout["replicas"]}[down.url]
    assert step["status"] == "succeeded"
    assert {"verify_models", "verify_completion"} <= {a["purpose"] for a in step["attempts"]}
