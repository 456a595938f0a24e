"""1. The worker is SIGKILLed while a rollout retries against a replica that is
down; the replica comes back, a new worker starts, and nobody touches the
rollout: it must finish by itself (the sweeper) and the adapter must answer on
every replica. On the tier's Redis and on the product's embedded broker."""

from __future__ import annotations

import time

import pytest

from serving.models import Rollout
from tests.faults.conftest import adapters_listed, answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

CONVERGE_SECONDS = 60


@pytest.mark.parametrize("broker", ["redis", "embedded"])
def test_a_rollout_whose_worker_was_killed_converges_by_itself(
    broker, stack, platform, replicas, proxy_b, measure
):
    m = measure(f"1. worker SIGKILLed mid-rollout ({broker} broker)", CONVERGE_SECONDS)
    stack.use_broker(broker)
    worker = stack.start_worker()
    a = replicas[0]
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))

    proxy_b.go_down()
    rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]
    # A is loaded while B refuses every connection: the worker is in B's retry loop.
    assert m.converge(lambda: "legal-contracts" in adapters_listed(a), timeout=60) is not None, (
        f"the first worker never loaded A:\n{worker.log_tail()}"
    )
    time.sleep(1.5)
    assert Rollout.objects.get(pk=rollout_id).status in ("loading", "verifying", "staging")

    worker.kill()
    proxy_b.come_up()
    m.fault_ended()
    # What a supervisor does: a new worker, and beat as ever.
    stack.start_worker()
    stack.start_beat()

    def served_everywhere() -> bool:
        rollout = Rollout.objects.get(pk=rollout_id)
        return (
            rollout.status == "succeeded"
            and answers(a.base_url, "legal-contracts")
            and answers(proxy_b.base_url, "legal-contracts")
        )

    m.converge(served_everywhere)
    m.settle()
    m.notes["final_status"] = Rollout.objects.get(pk=rollout_id).status
    m.check()
