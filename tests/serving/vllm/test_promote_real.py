"""Promote and swap through the REST API, rolled out by a real Celery worker
into two real vLLM servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.vllm.conftest import adapters_on, chat_through_openai
from tests.support.adapters import AdapterSpec

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


def test_promoted_version_is_served_on_both_replicas(platform, vllm_servers, celery_worker):
    urls = [server.base_url for server in vllm_servers]
    platform.create_deployment("staging-cpu", urls)
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))

    rollout = platform.promote_and_wait("staging-cpu", v1["id"])

    assert rollout["status"] == "succeeded", rollout["error"]
    assert rollout["kind"] == "promote"
    expected = f"{platform.volume}/legal/contracts/v1-{v1['manifest_sha256'][:8]}"
    assert rollout["served_path"] == expected
    assert sorted(p.name for p in Path(expected).iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    for server in vllm_servers:
        assert adapters_on(server) == {"legal-contracts": expected}
        chat_through_openai(server.base_url, "legal-contracts")

    steps = {step["base_url"]: step for step in rollout["replicas"]}
    assert set(steps) == set(urls)
    for url, step in steps.items():
        assert step["status"] == "succeeded", step
        calls = [(a["purpose"], a["method"], a["status_code"]) for a in step["attempts"]]
        assert ("load", "POST", 200) in calls
        assert ("verify_models", "GET", 200) in calls
        assert ("verify_completion", "POST", 200) in calls
        assert all(a["url"].startswith(url) for a in step["attempts"])
        assert all(a["ok"] and a["duration_ms"] > 0 for a in step["attempts"])


def test_v2_swaps_both_replicas_and_keeps_the_v1_folder(platform, vllm_servers, celery_worker):
    platform.create_deployment("staging-cpu", [server.base_url for server in vllm_servers])
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    v2 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=2))
    first = platform.promote_and_wait("staging-cpu", v1["id"])
    assert first["status"] == "succeeded", first["error"]

    swap = platform.promote_and_wait("staging-cpu", v2["id"])

    assert swap["status"] == "succeeded", swap["error"]
    assert swap["kind"] == "swap"
    assert swap["previous_version_number"] == 1
    v2_path = f"{platform.volume}/legal/contracts/v2-{v2['manifest_sha256'][:8]}"
    assert swap["served_path"] == v2_path
    for server in vllm_servers:
        assert adapters_on(server) == {"legal-contracts": v2_path}
        chat_through_openai(server.base_url, "legal-contracts")
    # Grace period: vLLM may re-read an evicted adapter from the old path.
    assert Path(first["served_path"]).is_dir()
    state = platform.member.get("/api/v1/deployments/staging-cpu/state/").json()
    assert [(d["served_name"], d["version"]) for d in state["desired"]] == [("legal-contracts", 2)]
