"""Automatic rollback against real vLLM servers: when verification fails on
one replica (a fault proxy in front of it answers completions with a 500),
and when vLLM itself refuses the load (a real 500 from a real server)."""

from __future__ import annotations

import pytest

from tests.serving.vllm.conftest import adapters_on, chat_through_openai, ok
from tests.support.adapters import AdapterSpec
from tests.support.fault_proxy import FaultProxy

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def faulty(vllm_servers):
    with FaultProxy(vllm_servers[0].base_url) as proxy:
        yield proxy


def test_failed_verification_on_one_replica_puts_every_replica_back_on_v1(
    platform, vllm_servers, faulty, celery_worker
):
    behind_proxy, direct = vllm_servers
    platform.create_deployment("staging-cpu", [faulty.base_url, direct.base_url])
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    v2 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=2))
    first = platform.promote_and_wait("staging-cpu", v1["id"])
    assert first["status"] == "succeeded", first["error"]
    v1_path = first["served_path"]

    faulty.fail_completions_for.add("legal-contracts")
    rollout = platform.promote_and_wait("staging-cpu", v2["id"])

    assert rollout["status"] == "rolled_back", rollout
    assert faulty.base_url in rollout["error"]
    assert faulty.fault_message in rollout["error"]
    assert "Verification failed on 1 replica(s)" in rollout["error"]
    assert "back on v1" in rollout["error"]
    assert faulty.faults_served == 1  # a 500 is permanent: not retried
    # Straight to the servers, not through the proxy: both are on v1 again.
    for server in vllm_servers:
        assert adapters_on(server) == {"legal-contracts": v1_path}
    chat_through_openai(direct.base_url, "legal-contracts")
    steps = {step["base_url"]: step for step in rollout["replicas"]}
    assert {s["status"] for s in steps.values()} == {"rolled_back"}
    # The replica that failed keeps its reason after the rollback.
    assert faulty.fault_message in steps[faulty.base_url]["error"]
    assert steps[direct.base_url]["error"] == ""
    # (A swap's load first meets vLLM's 400 "already loaded"; that is not a failure.)
    failed = [
        a
        for a in steps[faulty.base_url]["attempts"]
        if not a["ok"] and "has already been loaded" not in a["error"]
    ]
    assert [(a["purpose"], a["status_code"], a["transient"]) for a in failed] == [
        ("verify_completion", 500, False)
    ]
    assert failed[0]["error"] == faulty.fault_message
    state = ok(platform.member.get("/api/v1/deployments/staging-cpu/state/"))
    # Members see the staged folder's name, not the volume path on the host.
    assert [(d["served_name"], d["version"], d["served_path"]) for d in state["desired"]] == [
        ("legal-contracts", 1, v1_path.rstrip("/").rsplit("/", 1)[-1])
    ]

    # With the fault gone the same version goes through.
    faulty.fail_completions_for.clear()
    retry = platform.promote_and_wait("staging-cpu", v2["id"])
    assert retry["status"] == "succeeded", retry["error"]
    for server in vllm_servers:
        assert adapters_on(server) == {"legal-contracts": retry["served_path"]}


def test_vllm_refusing_the_load_is_permanent_and_unloads_everywhere(
    platform, vllm_servers, celery_worker
):
    # The deployment claims a higher limit than its servers were started with,
    # so the gate lets rank 32 through and real vLLM refuses it.
    platform.create_deployment(
        "misconfigured", [s.base_url for s in vllm_servers], max_lora_rank=32
    )
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=3, r=32))

    rollout = platform.promote_and_wait("misconfigured", version["id"])

    assert rollout["status"] == "rolled_back", rollout
    assert "Load failed on 2 replica(s)" in rollout["error"]
    assert "LoRA rank 32 is greater than max_lora_rank 16" in rollout["error"]
    assert "not loaded (there was no previous version)" in rollout["error"]
    for step in rollout["replicas"]:
        loads = [a for a in step["attempts"] if a["purpose"] == "load"]
        assert [(a["status_code"], a["transient"]) for a in loads] == [(500, False)]
        assert "greater than max_lora_rank 16" in loads[0]["error"]
    for server in vllm_servers:
        assert adapters_on(server) == {}
