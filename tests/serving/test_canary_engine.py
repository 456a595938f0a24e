"""The canary's worker (serving/rollouts/canary.py) on a real HAProxy in front
of two stand-in replicas: the split it sets, and each way a bake ends without
the gates' numbers deciding it (a person aborts, a person promotes, too few
requests to prove anything). The gates deciding on real traffic are in
tests/serving/vllm/test_canary_real.py."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from django.db.models.signals import post_save
from django.utils import timezone

from core.models import AuditEvent
from serving.door.services import door_sync, front_door_for
from serving.models import (
    Canary,
    CanaryRequest,
    HttpAttempt,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from serving.services.rollout_requests import rollout_canary_decide
from tests.conftest import actor
from tests.support.haproxy import needs_haproxy, running_haproxy
from tests.support.vllm_servers import free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_haproxy,
]


@pytest.fixture
def door(settings, deployment, tmp_path):
    settings.SERVING_DOORS = {deployment.name: f"127.0.0.1:{free_port()}"}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.SERVING_DOOR_DRAIN_SECONDS = 5.0
    # Open (no keys): these tests are about routing; keys: test_door_haproxy.py.
    deployment.open_door = True
    deployment.save(update_fields=["open_door"])
    door_sync(deployment)
    door = front_door_for(deployment)
    with running_haproxy(door, log=tmp_path / "haproxy.log"):
        yield door


@pytest.fixture
def served_v1(lena, deployment, approved_v1, door):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    return approved_v1


def start_canary(lena, deployment, version, bake: int):
    promotion = promotion_create(
        actor=actor(lena),
        deployment=deployment,
        version=version,
        canary_share=10,
        canary_bake_seconds=bake,
    )
    rollout = promotion.rollouts.get()
    ended: dict = {}
    worker = threading.Thread(
        target=lambda: ended.setdefault("status", rollout_execute(rollout.pk, "worker-1")),
        daemon=True,
    )
    worker.start()
    return rollout, worker, ended


def wait_baking(rollout: Rollout, timeout: float = 30, after: str = "") -> Rollout:
    """Until the worker bakes (and has judged the gates since `after`, an ISO time)."""
    deadline = time.monotonic() + timeout
    while True:
        rollout.refresh_from_db()
        gates = rollout.canary.gates
        if (
            rollout.status == RolloutStatus.BAKING
            and gates.get("counters")
            and gates.get("checked_at", "") > after
        ):
            return rollout
        assert time.monotonic() < deadline, (rollout.status, rollout.error)
        time.sleep(0.1)


def weights(door, model: str) -> dict[str, str]:
    import csv
    import io

    rows = csv.DictReader(io.StringIO(door.runtime.command("show stat").lstrip("# ")))
    return {
        row["svname"]: row["weight"]
        for row in rows
        if row["pxname"] == f"m_{model}" and row["svname"] not in ("FRONTEND", "BACKEND")
    }


@contextlib.contextmanager
def seen_as_it_ends(door, rollout: Rollout, model: str):
    """What a client reads at the instant the rollout's end is recorded (its
    audit event is written in the same transaction as the status)."""
    seen: dict = {}

    def record(sender, instance, **kwargs):
        if instance.object_id == str(rollout.pk) and instance.action in (
            f"rollout.{RolloutStatus.ROLLED_BACK}",
            f"rollout.{RolloutStatus.FAILED}",
        ):
            seen["rollback"] = Canary.objects.get(rollout=rollout).gates["rollback"]
            seen["weights"] = weights(door, model)

    post_save.connect(record, sender=AuditEvent, weak=False)
    try:
        yield seen
    finally:
        post_save.disconnect(record, sender=AuditEvent)


def servers_of(deployment) -> tuple[str, str]:
    canary, other = deployment.replicas.order_by("base_url")
    return f"r{canary.pk}", f"r{other.pk}"


def test_a_person_aborts_a_baking_canary_and_traffic_leaves_it_at_once(
    door, alex, lena, deployment, served_v1, approved_v2, fake_replicas
):
    rollout, worker, ended = start_canary(lena, deployment, approved_v2, bake=300)
    rollout = wait_baking(rollout)
    canary, other = servers_of(deployment)
    haproxy_worker = door.runtime.worker_pid()
    assert weights(door, "legal-contracts") == {canary: "10", other: "90"}
    # The split is in the rendered configuration too: a reload keeps it.
    config = door.config_path.read_text().split("backend m_legal-contracts")[1].split("\n\n")[0]
    assert "balance roundrobin" in config
    assert f"server {canary} " in config and f"{other} " in config and "weight 90" in config

    with seen_as_it_ends(door, rollout, "legal-contracts") as at_the_end:
        rollout_canary_decide(actor=actor(alex), rollout=rollout, request=CanaryRequest.ABORT)
        worker.join(30)
    assert ended["status"] == RolloutStatus.ROLLED_BACK
    # Whoever sees it rolled back sees the whole report and the split undone.
    assert at_the_end["rollback"]["restored_ms"] > at_the_end["rollback"]["drained_ms"]
    assert at_the_end["weights"] == {canary: "1", other: "1"}
    rollout.refresh_from_db()
    assert rollout.canary.outcome == "aborted"
    assert rollout.error.startswith(f"Aborted by {alex.username}. Traffic left the canary in ")
    switch = rollout.canary.gates["rollback"]
    # The switch is one runtime command, without a reload: what makes it fast.
    # Its time is bounded loosely: the light run is niced beside vLLM, and both
    # this process and HAProxy may wait for a CPU.
    assert (
        HttpAttempt.objects.filter(
            method="RUNTIME", url__endswith=f"set weight m_legal-contracts/{canary} 0"
        ).count()
        == 1
    )
    assert door.runtime.worker_pid() == haproxy_worker
    assert switch["switch_ms"] < 5000
    assert switch["restored_ms"] > switch["drained_ms"] >= switch["switch_ms"]
    assert weights(door, "legal-contracts") == {canary: "1", other: "1"}
    assert ServedAdapter.objects.get(deployment=deployment).gateway_weights == {}
    v1_root = ServedAdapter.objects.get(deployment=deployment).served_path
    for replica in fake_replicas:
        assert replica.adapters == {"legal-contracts": v1_root}
    actions = list(
        AuditEvent.objects.filter(object_id=str(rollout.pk), object_type="serving.rollout")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "rollout.swap",
        "rollout.canary_started",
        "rollout.canary_abort_requested",
        "rollout.canary_aborted",
        "rollout.canary_switched_back",
        "rollout.rolled_back",
    ]


def test_a_person_promotes_a_baking_canary_and_every_replica_takes_the_new_version(
    door, alex, lena, deployment, served_v1, approved_v2, fake_replicas
):
    rollout, worker, ended = start_canary(lena, deployment, approved_v2, bake=300)
    rollout = wait_baking(rollout)
    rollout_canary_decide(actor=actor(alex), rollout=rollout, request=CanaryRequest.PROMOTE)
    worker.join(30)
    assert ended["status"] == RolloutStatus.SUCCEEDED
    rollout.refresh_from_db()
    assert rollout.canary.outcome == "promoted"
    served = ServedAdapter.objects.get(deployment=deployment)
    assert served.version_id == approved_v2.pk and served.gateway_weights == {}
    for replica in fake_replicas:
        assert replica.adapters == {"legal-contracts": rollout.served_path}
    canary, other = servers_of(deployment)
    assert weights(door, "legal-contracts") == {canary: "1", other: "1"}


def test_a_canary_without_enough_requests_in_its_bake_is_not_proven_and_rolled_back(
    door, lena, deployment, served_v1, approved_v2, fake_replicas, settings
):
    settings.SERVING_CANARY_MIN_REQUESTS = 5
    rollout, worker, ended = start_canary(lena, deployment, approved_v2, bake=2)
    worker.join(60)
    assert ended["status"] == RolloutStatus.ROLLED_BACK
    rollout.refresh_from_db()
    assert rollout.canary.outcome == "failed"
    assert rollout.error.startswith(
        "Canary gates failed: not proven: the canary had 0 requests in its bake time, "
        "5 are needed to judge it. Traffic left the canary in "
    )
    v1_root = ServedAdapter.objects.get(deployment=deployment).served_path
    for replica in fake_replicas:
        assert replica.adapters == {"legal-contracts": v1_root}


def test_a_cancelled_canary_takes_no_more_traffic_at_once(
    door, alex, lena, deployment, served_v1, approved_v2
):
    from serving.services.rollout_requests import rollout_cancel

    rollout, worker, ended = start_canary(lena, deployment, approved_v2, bake=300)
    rollout = wait_baking(rollout)
    canary, other = servers_of(deployment)
    rollout_cancel(actor=actor(alex), rollout=rollout)
    worker.join(30)
    assert ended["status"] == RolloutStatus.CANCELLED
    assert weights(door, "legal-contracts")[canary] == "0"
    assert ServedAdapter.objects.get(deployment=deployment).gateway_weights == {}


def test_a_worker_killed_mid_bake_is_resumed_on_the_same_deadline_and_counts(
    door, alex, lena, deployment, served_v1, approved_v2, settings
):
    settings.SERVING_CLAIM_SECONDS = 3.0
    rollout, worker, ended = start_canary(lena, deployment, approved_v2, bake=300)
    rollout = wait_baking(rollout)
    deadline, counters = rollout.canary.bake_until, rollout.canary.gates["counters"]
    # Its claim taken from it, the worker stops at its next heartbeat.
    served = ServedAdapter.objects.get(deployment=deployment)
    ServedAdapter.objects.filter(pk=served.pk).update(lease_owner="killed-worker")
    worker.join(30)
    assert not worker.is_alive()
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.BAKING  # left as it was
    ServedAdapter.objects.filter(pk=served.pk).update(lease_owner="", lease_until=None)

    resumed: dict = {}
    second = threading.Thread(
        target=lambda: resumed.setdefault("status", rollout_execute(rollout.pk, "worker-2")),
        daemon=True,
    )
    second.start()
    deadline_at = time.monotonic() + 30
    while ServedAdapter.objects.get(pk=served.pk).lease_owner != "worker-2":
        assert time.monotonic() < deadline_at
        time.sleep(0.1)
    rollout = wait_baking(rollout, after=timezone.now().isoformat())
    assert rollout.canary.bake_until == deadline
    assert rollout.canary.gates["counters"]["base"] == counters["base"]
    canary, other = servers_of(deployment)
    assert weights(door, "legal-contracts") == {canary: "10", other: "90"}
    rollout_canary_decide(actor=actor(alex), rollout=rollout, request=CanaryRequest.ABORT)
    second.join(30)
    assert resumed["status"] == RolloutStatus.ROLLED_BACK
    started = AuditEvent.objects.filter(
        object_id=str(rollout.pk), action="rollout.canary_started"
    ).count()
    assert started == 1
