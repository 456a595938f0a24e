"""8. Two beats run at once (two beat replicas by mistake, or an old one that
never stopped): each periodic task is sent twice at the same instant. No work
may be done twice: one repair per drift, one run per lost rollout."""

from __future__ import annotations

import pytest

from core.models import AuditEvent
from serving.models import DriftEvent, HttpAttempt, Rollout
from tests.faults.conftest import answers, wait_for
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec
from tests.support.fault_proxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)


def tick_twice(task_name: str) -> None:
    """What two beats do on the same tick: send the same task twice."""
    from config.celery import app

    for _ in range(2):
        app.send_task(task_name)


def test_two_reconcile_ticks_at_the_same_instant_repair_a_drift_once(
    stack, platform, replicas, measure
):
    m = measure("8a. two beats: reconcile ticks at the same instant (one repair)", 30)
    stack.use_broker("redis")
    stack.start_worker(concurrency=4)
    a, b = replicas
    with FaultProxy(a.base_url) as proxy_a:
        platform.create_deployment("faults", [proxy_a.base_url, b.base_url])
        version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=8))
        promoted = ok(platform.promote("faults", version["id"]), 201)
        rollout = platform.wait_rollout(promoted["rollout"])
        assert rollout["status"] == "succeeded", rollout["error"]

        with a.client(timeout=30) as client:  # drift: A forgets the adapter
            assert client.unload_adapter("legal-contracts").ok
        # Both ticks' reconciles are still reading A's listing when the other starts.
        proxy_a.latency_by_path["/v1/models"] = 1.5
        tick_twice("serving.reconcile_all")
        m.fault_ended()
        m.converge(lambda: answers(a.base_url, "legal-contracts"))
        # Give a second, duplicate repair every chance to land before counting.
        wait_for(lambda: False, timeout=4)
        m.settle()
        repairs = DriftEvent.objects.filter(replica__base_url=proxy_a.base_url)
        loads = HttpAttempt.objects.filter(
            replica__base_url=proxy_a.base_url, replica_rollout__isnull=True, purpose="load"
        )
        m.notes.update(
            repairs=list(repairs.values_list("kind", flat=True)),
            reconcile_loads_on_a=loads.count(),
            listings_of_a=sum(path == "/v1/models" for _, path in proxy_a.requests),
        )
    m.check()
    assert list(repairs.values_list("kind", flat=True)) == ["missing_reloaded"]
    assert loads.count() == 1


def test_two_sweep_ticks_at_the_same_instant_run_a_lost_rollout_once(
    stack, platform, replicas, fault_redis, measure, lena
):
    from config.celery import app
    from registry.models import AdapterVersion
    from serving.models import Deployment
    from serving.services.promotions import promotion_create
    from tests.conftest import actor

    m = measure("8b. two beats: sweep ticks at the same instant (one run)", 45)
    stack.use_broker("redis")
    stack.start_worker(concurrency=4)
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=9))

    # The enqueue is lost: the broker is away when the promotion commits.
    fault_redis.kill()
    try:
        promotion_create(
            actor=actor(lena),
            deployment=Deployment.objects.get(name="faults"),
            version=AdapterVersion.objects.get(pk=version["id"]),
        )
    except Exception as error:  # noqa: BLE001 - main raises the enqueue error after commit
        m.notes["promotion_raised"] = type(error).__name__
    fault_redis.start()
    rollout = Rollout.objects.get()
    m.fault_ended()
    import serving.tasks  # noqa: F401 - registers the product's tasks in this process

    assert "serving.sweep" in app.tasks, "no serving.sweep task: nothing resumes a lost rollout"

    def done() -> bool:
        tick_twice("serving.sweep")
        return Rollout.objects.get(pk=rollout.pk).status == "succeeded" and all(
            answers(url, "legal-contracts") for url in (a.base_url, b.base_url)
        )

    m.converge(done, interval=1.0)
    wait_for(lambda: False, timeout=3)
    m.settle()
    loads = HttpAttempt.objects.filter(replica_rollout__rollout=rollout, purpose="load")
    m.notes["loads"] = loads.count()
    m.notes["succeeded_events"] = AuditEvent.objects.filter(
        object_id=str(rollout.pk), action="rollout.succeeded"
    ).count()
    m.check()
    assert loads.count() == 2, "one load per replica, not one per sweep"
