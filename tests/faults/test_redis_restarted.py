"""2. Redis is restarted mid-rollout. It keeps nothing on disk, as a cache-style
Redis does: the message of the rollout in progress and any message sent while
it is away are gone. A promotion made while Redis is down is the lost-enqueue
case: its rows are committed, its task never reached a queue.

Until config/celery_redis.py, the worker holding the first rollout's task never
consumed again (celery/celery#10205, #10302: restore_unacked on a collected
connection, "Unrecoverable error", a warm shutdown waiting for that task), so
the second promotion stayed pending."""

from __future__ import annotations

import pytest

from serving.models import Rollout
from tests.faults.conftest import answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

CONVERGE_SECONDS = 60
LOAD = "/v1/load_lora_adapter"


def test_rollouts_converge_after_redis_restarts_mid_rollout(
    stack, platform, replicas, proxy_b, measure, fault_redis
):
    m = measure("2. Redis restarted mid-rollout (+ a promotion while it is down)", CONVERGE_SECONDS)
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    a = replicas[0]
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    first = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    second = platform.approved_version("leases", "legal-leases", AdapterSpec(seed=2))

    # B is up (the reconcile sees it) but refuses loads for now: the rollout retries.
    proxy_b.fail_paths[LOAD] = 503
    ok(platform.promote("faults", first["id"]), 201)
    retrying = m.converge(
        lambda: sum(path.startswith(LOAD) for _, path in proxy_b.requests) >= 2, timeout=60
    )
    assert retrying is not None, "the rollout never reached B"

    fault_redis.kill()
    try:
        response = platform.promote("faults", second["id"])
        answered = response.status_code
    except Exception as error:  # noqa: BLE001 - the enqueue after commit raised out of the view
        answered = f"raised {type(error).__name__}: {error}"
    m.notes["promotion_while_redis_down"] = answered
    fault_redis.start()
    proxy_b.fail_paths.clear()
    m.fault_ended()
    rollout_ids = list(Rollout.objects.values_list("pk", flat=True))
    assert len(rollout_ids) == 2, "the promotion made while Redis was down left no rollout"

    def served_everywhere() -> bool:
        statuses = set(Rollout.objects.filter(pk__in=rollout_ids).values_list("status", flat=True))
        return statuses == {"succeeded"} and all(
            answers(url, name)
            for url in (a.base_url, proxy_b.base_url)
            for name in ("legal-contracts", "legal-leases")
        )

    m.converge(served_everywhere)
    m.settle()
    m.notes["final_status"] = dict(
        Rollout.objects.filter(pk__in=rollout_ids).values_list("pk", "status")
    )
    m.check()
    # The promotion was committed: the person who made it must be told so, not see a 500.
    assert answered == 201, answered
