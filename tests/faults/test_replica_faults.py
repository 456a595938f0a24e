"""6. A replica is killed (SIGKILL, engine and all) while a load is in flight,
and later a replica is restarted: vLLM keeps nothing across a restart, so the
reconcile must load its adapters again."""

from __future__ import annotations

import pytest

from serving.models import DriftEvent, Rollout
from tests.faults.conftest import adapters_listed, answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

LOAD = "/v1/load_lora_adapter"


def test_a_replica_killed_mid_load_then_a_replica_restarted(
    stack, platform, replicas, proxy_b, measure
):
    killed = measure("6a. replica SIGKILLed mid-load (back after its restart)", 60)
    restarted = measure("6b. replica restarted: reconcile restores its adapters", 45)
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=6))

    # The proxy holds B's load for a moment: long enough to kill B under it.
    proxy_b.latency_by_path[LOAD] = 3.0
    rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]
    assert killed.converge(
        lambda: any(path.startswith(LOAD) for _, path in proxy_b.requests), timeout=60
    ), "the rollout never sent B its load"
    b.kill()
    proxy_b.latency_by_path.clear()
    b.start_and_wait(timeout=300)
    killed.fault_ended()
    killed.notes["replica_restart_seconds"] = round(b.last_start_seconds or 0, 1)

    def served_everywhere() -> bool:
        return (
            Rollout.objects.get(pk=rollout_id).status == "succeeded"
            and answers(a.base_url, "legal-contracts")
            and answers(proxy_b.base_url, "legal-contracts")
        )

    killed.converge(served_everywhere)
    killed.settle()
    killed.notes["final_status"] = Rollout.objects.get(pk=rollout_id).status

    # vLLM forgets everything across a restart; nobody tells the control plane.
    a.restart(timeout=300)
    assert adapters_listed(a) == {}
    restarted.fault_ended()
    restarted.converge(lambda: answers(a.base_url, "legal-contracts"))
    restarted.settle()
    restarted.notes["reloads_recorded"] = DriftEvent.objects.filter(
        replica__base_url=a.base_url, kind="missing_reloaded"
    ).count()

    killed.check()
    restarted.check()
    assert restarted.notes["reloads_recorded"] == 1
