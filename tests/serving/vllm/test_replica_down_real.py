"""A replica that is down during a rollout is retried until it is back.

The replica is a real vLLM server reached through a byte-for-byte relay
(TcpProxy, tests/support/processes.py) that stops listening and cuts its
connections while it is "down": the control plane sees what it sees of a
stopped server (connection refused), and no vLLM start is spent bringing it
back. A real crash and restart, and the
adapters vLLM then forgets, are tests/serving/vllm/test_reconcile_real.py and
tests/faults/test_replica_faults.py."""

from __future__ import annotations

import time

import pytest

from tests.serving.vllm.conftest import (
    adapters_on,
    chat_through_openai,
    ok,
    wait_until,
)
from tests.support.adapters import AdapterSpec
from tests.support.processes import TcpProxy

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


def test_rollout_retries_a_replica_that_is_down_and_succeeds_once_it_is_back(
    platform, vllm_servers, celery_worker, settings, request
):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 120.0
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 2.0
    up, behind = vllm_servers
    down = TcpProxy.in_front_of(behind.base_url)
    request.addfinalizer(down.close)
    platform.create_deployment("staging-cpu", [up.base_url, down.url])
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))

    down.go_down()
    promotion = ok(platform.promote("staging-cpu", v1["id"]), 201)
    rollout_id = promotion["rollout"]
    wait_until(
        lambda: platform.rollout(rollout_id)["status"] == "loading",
        timeout=60,
        message="rollout reaches loading",
    )
    time.sleep(3)  # a few refused attempts
    assert platform.rollout(rollout_id)["status"] == "loading"

    down.come_up()
    rollout = platform.wait_rollout(rollout_id, timeout=300)

    assert rollout["status"] == "succeeded", rollout["error"]
    for server in vllm_servers:
        assert adapters_on(server) == {"legal-contracts": rollout["served_path"]}
        chat_through_openai(server.base_url, "legal-contracts")

    steps = {step["base_url"]: step for step in rollout["replicas"]}
    assert steps[down.url]["status"] == "succeeded"
    attempts = steps[down.url]["attempts"]
    refused = [a for a in attempts if a["status_code"] is None]
    assert len(refused) >= 2, attempts
    assert all(a["transient"] and not a["ok"] for a in refused)
    assert all("Connection refused" in a["error"] for a in refused), refused[0]["error"]
    # Retried until the server answered, then carried on to load and verify.
    first_ok = next(i for i, a in enumerate(attempts) if a["ok"])
    assert all(a["transient"] for a in attempts[:first_ok])
    purposes = [a["purpose"] for a in attempts[first_ok:]]
    assert {"load", "verify_models", "verify_completion"} <= set(purposes)
    # The replica that was up needed no retry.
    assert all(a["ok"] for a in steps[up.base_url]["attempts"])
