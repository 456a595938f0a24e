"""The compatibility gate refuses before anything reaches vLLM. A counting
proxy stands in front of each real server to prove that no request left."""

from __future__ import annotations

import time

import pytest

from serving.models import HttpAttempt, Promotion, Rollout
from tests.serving.vllm.conftest import adapters_on, ok
from tests.support.adapters import AdapterSpec
from tests.support.fault_proxy import FaultProxy

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def counted(vllm_servers):
    proxies = [FaultProxy(server.base_url) for server in vllm_servers]
    yield proxies
    for proxy in proxies:
        proxy.close()


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        pytest.param(AdapterSpec(seed=1, r=32), ["Rank 32", "max_lora_rank 16"], id="rank"),
        pytest.param(
            AdapterSpec(seed=2, base_model="other-org/other-tiny"),
            ["other-org/other-tiny", "tiny-llama"],
            id="other-base-model",
        ),
    ],
)
def test_gate_refuses_without_any_call_to_vllm(
    platform, vllm_servers, counted, celery_worker, spec, named
):
    platform.create_deployment("staging-cpu", [proxy.base_url for proxy in counted])
    version = platform.approved_version("contracts", "legal-contracts", spec)
    before = [adapters_on(server) for server in vllm_servers]

    preview = ok(
        platform.member.get(f"/api/v1/deployments/staging-cpu/gate/?version={version['id']}")
    )
    response = platform.promote("staging-cpu", version["id"])

    assert response.status_code == 422, response.json()
    error = response.json()["error"]
    assert error["code"] == "compatibility_gate_failed"
    for words in named:
        assert words in error["message"]
    assert preview["passed"] is False
    failed = {c["name"] for c in preview["checks"] if not c["ok"] and not c["advisory"]}
    assert failed == ({"rank"} if spec.r > 16 else {"base_model"})

    time.sleep(2)  # anything enqueued would have reached the worker by now
    assert Promotion.objects.count() == 0
    assert Rollout.objects.count() == 0
    assert HttpAttempt.objects.count() == 0
    assert [proxy.requests for proxy in counted] == [[], []]
    assert [adapters_on(server) for server in vllm_servers] == before == [{}, {}]
