"""6. A replica is killed (SIGKILL, engine and all) while a load is in flight,
and comes back empty: vLLM keeps nothing across a restart. The rollout in
flight must converge once the replica is back, and the reconcile must load
the adapters the replica served before it died (one restart serves both
halves: a vLLM start is the slowest thing in this tier)."""

from __future__ import annotations

import pytest

from serving.models import DriftEvent, Rollout
from tests.faults.conftest import answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

LOAD = "/v1/load_lora_adapter"


def loads_seen(proxy) -> int:
    return sum(path.startswith(LOAD) for _, path in proxy.requests)


def test_a_replica_killed_mid_load_comes_back_with_every_adapter(
    stack, platform, replicas, proxy_b, measure
):
    killed = measure("6a. replica SIGKILLed mid-load: the rollout converges after", 60)
    restarted = measure("6b. replica restarted empty: reconcile restores its adapters", 60)
    # The rollout must outlast a vLLM start on a busy machine (two minutes, seen here).
    stack.extra_env["SERVING_RETRY_DEADLINE_SECONDS"] = "600"
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    served = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=6))
    incoming = platform.approved_version("leases", "legal-leases", AdapterSpec(seed=16))
    assert platform.promote_and_wait("faults", served["id"])["status"] == "succeeded"

    # The proxy holds B's next load for a moment: long enough to kill B under it.
    before = loads_seen(proxy_b)
    proxy_b.latency_by_path[LOAD] = 3.0
    rollout_id = ok(platform.promote("faults", incoming["id"]), 201)["rollout"]
    assert killed.converge(lambda: loads_seen(proxy_b) > before, timeout=60), (
        "the rollout never sent B its load"
    )
    b.kill()
    proxy_b.latency_by_path.clear()
    b.start_and_wait(timeout=300)
    for m in (killed, restarted):
        m.fault_ended()
        m.notes["replica_start_seconds"] = round(b.last_start_seconds or 0, 1)

    def incoming_served_everywhere() -> bool:
        return (
            Rollout.objects.get(pk=rollout_id).status == "succeeded"
            and answers(a.base_url, "legal-leases")
            and answers(proxy_b.base_url, "legal-leases")
        )

    killed.converge(incoming_served_everywhere)
    restarted.converge(lambda: answers(proxy_b.base_url, "legal-contracts"))
    for m in (killed, restarted):
        m.settle()
    killed.notes["final_status"] = Rollout.objects.get(pk=rollout_id).status
    reloads = DriftEvent.objects.filter(
        replica__base_url=proxy_b.base_url, kind="missing_reloaded", adapter_name="legal-contracts"
    )
    restarted.notes["reloads_recorded"] = reloads.count()

    killed.check()
    restarted.check()
    assert reloads.count() == 1, "the reload was not recorded as one drift repair"
