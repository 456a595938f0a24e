"""A controller that never gets stuck: short claims renewed through back-off,
the sweeper, compare-and-swap status changes, cancel, and replicas that are
down when a rollout starts (deferred, then finished by the reconcile).
Against fake vLLM replicas; tests/serving/vllm has the real-server versions."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerDown

from core.errors import Conflict, NotAuthorized
from core.models import AuditEvent
from serving.models import (
    HttpAttempt,
    Replica,
    ReplicaStepStatus,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.reconcile.tick import reconcile_deployment
from serving.records.leases import served_adapter_claim
from serving.rollouts import engine
from serving.rollouts.engine import rollout_execute
from serving.rollouts.sweep import rollouts_to_sweep, sweep_rollouts
from serving.services.promotions import promotion_create
from serving.services.rollout_requests import rollout_cancel
from tests.conftest import actor, client_for


def promote(user, deployment, version, **extra) -> Rollout:
    promotion = promotion_create(actor=actor(user), deployment=deployment, version=version, **extra)
    return promotion.rollouts.get()


def age(rollout: Rollout, seconds: float) -> None:
    """As if the rollout had been sent `seconds` ago."""
    Rollout.objects.filter(pk=rollout.pk).update(
        enqueued_at=timezone.now() - timedelta(seconds=seconds)
    )


# --- the sweeper ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_lost_enqueue_is_sent_again_by_the_sweeper(
    lena, deployment, approved_v1, fake_replicas, settings, django_capture_on_commit_callbacks
):
    settings.SERVING_SWEEP_AFTER_SECONDS = 5
    api = client_for(lena)
    with (
        mock.patch("serving.tasks.run_rollout.delay", side_effect=BrokerDown("broker down")),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = api.post(
            "/api/v1/promotions/",
            {"deployment": deployment.name, "version": approved_v1.pk},
            format="json",
        )
    assert response.status_code == 201, response.content  # committed, not a 500
    rollout = Rollout.objects.get(pk=response.json()["rollout"])
    assert rollout.status == RolloutStatus.PENDING

    with mock.patch("serving.tasks.run_rollout.delay") as send:
        assert sweep_rollouts() == []  # sent a moment ago: not yet
        age(rollout, 6)
        assert sweep_rollouts() == [rollout.pk]
    send.assert_called_once_with(rollout.pk)
    assert rollout_execute(rollout.pk, "w") == RolloutStatus.SUCCEEDED


@pytest.mark.django_db
def test_the_sweeper_leaves_held_and_finished_rollouts_alone(
    lena, deployment, approved_v1, approved_v2, fake_replicas
):
    done = promote(lena, deployment, approved_v1)
    rollout_execute(done.pk, "w")
    busy = promote(lena, deployment, approved_v2)
    age(done, 600)
    age(busy, 600)
    served = ServedAdapter.objects.get(deployment=deployment)
    assert served_adapter_claim(served.pk, "a-live-worker")
    assert list(rollouts_to_sweep()) == []

    # The worker died: its claim expires, and the rollout is swept.
    ServedAdapter.objects.filter(pk=served.pk).update(
        lease_until=timezone.now() - timedelta(seconds=1)
    )
    assert [r.pk for r in rollouts_to_sweep()] == [busy.pk]


@pytest.mark.django_db
def test_two_sweepers_at_once_send_a_rollout_once(lena, deployment, approved_v1):
    rollout = promote(lena, deployment, approved_v1)
    age(rollout, 600)
    with mock.patch("serving.tasks.run_rollout.delay") as send:
        first = rollouts_to_sweep().values_list("pk", "enqueued_at")[0]
        # The second beat read the same row and swept it first.
        assert sweep_rollouts() == [rollout.pk]
        taken = Rollout.objects.filter(pk=first[0], enqueued_at=first[1]).update(
            enqueued_at=timezone.now()
        )
        assert taken == 0
        assert sweep_rollouts() == []
    assert send.call_count == 1


@pytest.mark.django_db
def test_a_swept_rollout_resumes_from_its_recorded_state(
    lena, deployment, approved_v1, fake_replicas
):
    rollout = promote(lena, deployment, approved_v1)
    # A worker staged it and was killed while loading.
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.LOADING)
    assert rollout_execute(rollout.pk, "second-worker") == RolloutStatus.SUCCEEDED
    assert all(r.adapters.get("legal-contracts") for r in fake_replicas)


# --- claims, heartbeat, compare-and-swap -----------------------------------------


def until_seen(condition, seconds: float = 60) -> None:
    """Waits for `condition` (what a replica has seen) for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the rollout never got there"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_the_claim_is_renewed_through_retry_back_off(
    lena, deployment, approved_v1, fake_replicas, settings
):
    # A 5 s claim, renewed at each checkpoint: the light run is niced beside
    # vLLM, and a shorter claim lapsed while this process waited for the CPU
    # (the thief then took it from a worker that was only starved, not stuck:
    # a 2 s claim once, a 3 s one in CI on 2026-12-07, 0.3 s before release).
    settings.SERVING_CLAIM_SECONDS = 5
    settings.SERVING_RETRY_DEADLINE_SECONDS = 60
    settings.SERVING_RETRY_BASE_SECONDS = 0.2
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 0.5
    fake_replicas[1].unavailable = 24  # 11.6 s of back-off: longer than two claims
    rollout = promote(lena, deployment, approved_v1)
    served = ServedAdapter.objects.get(deployment=deployment)
    stolen, stop, released = [], threading.Event(), []
    release = engine.served_adapter_release

    def released_then(served_id, owner):
        released.append(time.monotonic())
        release(served_id, owner)

    def thief():
        time.sleep(0.3)  # the worker claims first
        while not stop.is_set():
            if served_adapter_claim(served.pk, "thief"):
                stolen.append(time.monotonic())
            time.sleep(0.1)
        connections.close_all()

    started = time.monotonic()
    other = threading.Thread(target=thief)
    other.start()
    try:
        with mock.patch.object(engine, "served_adapter_release", released_then):
            assert rollout_execute(rollout.pk, "worker") == RolloutStatus.SUCCEEDED
    finally:
        stop.set()
        other.join()
    assert time.monotonic() - started > 2 * settings.SERVING_CLAIM_SECONDS
    assert stolen == [] or stolen[0] > released[0]  # only after the worker let go
    assert HttpAttempt.objects.filter(status_code=503).count() == 24


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_its_claim_stops_without_writing_more(
    lena, deployment, approved_v1, fake_replicas, settings
):
    settings.SERVING_CLAIM_SECONDS = 0.6
    settings.SERVING_RETRY_DEADLINE_SECONDS = 30
    settings.SERVING_RETRY_BASE_SECONDS = 0.1
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 0.2
    fake_replicas[1].unavailable = 10_000
    rollout = promote(lena, deployment, approved_v1)
    served = ServedAdapter.objects.get(deployment=deployment)

    def take_over():
        # Once the replica has answered two 503s (not after a fixed 0.5 s: a
        # starved worker may not have sent them yet; the light run is niced).
        until_seen(lambda: len(fake_replicas[1].requests) >= 3)
        ServedAdapter.objects.filter(pk=served.pk).update(lease_owner="another-worker")
        connections.close_all()

    other = threading.Thread(target=take_over)
    other.start()
    started = time.monotonic()
    status = rollout_execute(rollout.pk, "worker")
    other.join()

    assert time.monotonic() - started < 10  # not the 30 s retry deadline
    assert status == RolloutStatus.LOADING  # left for the new holder, not failed
    assert not AuditEvent.objects.filter(action="rollout.rolled_back").exists()
    # The attempts made before it stopped are recorded.
    assert HttpAttempt.objects.filter(status_code=503).count() >= 2


@pytest.mark.django_db
def test_a_status_change_someone_else_made_is_never_overwritten(
    lena, deployment, approved_v1, fake_replicas
):
    from serving.rollouts.steps import RolloutContext, Stopped, Watch, set_status

    rollout = promote(lena, deployment, approved_v1)
    served = ServedAdapter.objects.get(deployment=deployment)
    served_adapter_claim(served.pk, "w")
    watch = Watch(rollout.pk, served.pk, "w")
    ctx = RolloutContext(rollout, deployment, [], {}, None, watch)
    # Read as pending; meanwhile another worker moved it on.
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.LOADING)
    with pytest.raises(Stopped):
        set_status(ctx, RolloutStatus.STAGING)
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.LOADING


@pytest.mark.django_db
def test_the_replicas_threads_open_no_database_connection(
    lena, deployment, approved_v1, fake_replicas, settings
):
    # Retried within a deadline a starved run cannot reach (not serving's test 1 s).
    settings.SERVING_RETRY_DEADLINE_SECONDS = 60
    fake_replicas[0].unavailable = 2  # back-off sleeps in a replica's thread
    rollout = promote(lena, deployment, approved_v1)
    main = threading.get_ident()
    opened_by = []
    connect = BaseDatabaseWrapper.connect

    def spy(self):
        opened_by.append(threading.get_ident())
        return connect(self)

    with mock.patch.object(BaseDatabaseWrapper, "connect", spy):
        assert rollout_execute(rollout.pk, "w") == RolloutStatus.SUCCEEDED
    assert [ident for ident in opened_by if ident != main] == []


# --- cancel ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_rollout_in_back_off_and_frees_the_adapter(
    lena, alex, deployment, approved_v1, approved_v2, fake_replicas, settings
):
    settings.SERVING_CLAIM_SECONDS = 3
    settings.SERVING_RETRY_DEADLINE_SECONDS = 60
    settings.SERVING_RETRY_BASE_SECONDS = 0.1
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 0.2
    fake_replicas[1].unavailable = 10_000
    rollout = promote(lena, deployment, approved_v1)

    def cancel_soon():
        # In back-off, with replica 0 loaded (not after a fixed 0.8 s, which a
        # starved worker may not have reached yet; the light run is niced).
        until_seen(
            lambda: (
                "legal-contracts" in fake_replicas[0].adapters
                and len(fake_replicas[1].requests) >= 2
            )
        )
        rollout_cancel(actor=actor(alex), rollout=rollout, comment="replica is being replaced")
        connections.close_all()

    other = threading.Thread(target=cancel_soon)
    other.start()
    started = time.monotonic()
    status = rollout_execute(rollout.pk, "worker")
    other.join()

    assert status == RolloutStatus.CANCELLED
    assert time.monotonic() - started < 10
    rollout.refresh_from_db()
    assert rollout.cancelled_by == alex
    assert rollout.error == "Cancelled by alex. replica is being replaced"
    assert set(rollout.replica_steps.values_list("status", flat=True)) <= {
        ReplicaStepStatus.CANCELLED,
        ReplicaStepStatus.SUCCEEDED,
    }
    event = AuditEvent.objects.get(action="rollout.cancelled")
    assert (event.from_state, event.to_state, event.comment) == (
        "loading",
        "cancelled",
        "replica is being replaced",
    )
    served = ServedAdapter.objects.get(deployment=deployment)
    assert served.lease_owner == "" and served.version is None
    # Nothing was served before: the reconcile unloads what the rollout had loaded.
    assert "legal-contracts" in fake_replicas[0].adapters
    reconcile_deployment(deployment.pk, "beat")
    assert "legal-contracts" not in fake_replicas[0].adapters
    # A new promotion of the same version is accepted at once.
    fake_replicas[1].unavailable = 0
    again = promote(lena, deployment, approved_v1)
    assert rollout_execute(again.pk, "w") == RolloutStatus.SUCCEEDED


@pytest.mark.django_db
def test_cancel_of_a_stuck_rollout_clears_the_dead_workers_claim(
    alex, lena, deployment, approved_v1
):
    rollout = promote(lena, deployment, approved_v1)
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.LOADING)
    served = ServedAdapter.objects.get(deployment=deployment, adapter=approved_v1.adapter)
    ServedAdapter.objects.filter(pk=served.pk).update(
        lease_owner="killed-worker", lease_until=timezone.now() - timedelta(seconds=1)
    )
    rollout_cancel(actor=actor(alex), rollout=rollout)
    served.refresh_from_db()
    assert (served.lease_owner, served.lease_until) == ("", None)


@pytest.mark.django_db
def test_only_approvers_and_admins_cancel_and_only_unfinished_rollouts(
    lena, alex, root, fred, deployment, approved_v1, fake_replicas, legal_token
):
    rollout = promote(lena, deployment, approved_v1)
    url = f"/api/v1/rollouts/{rollout.pk}/cancel/"
    assert client_for(lena).post(url).status_code == 403
    assert client_for(fred).post(url).status_code == 404
    assert client_for("token", legal_token).post(url).status_code == 403
    answer = client_for(root).post(url, {"comment": "wrong version"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "cancelled"
    assert answer.json()["cancelled_by"] == "root"
    again = client_for(alex).post(url)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invalid_transition"
    with pytest.raises(NotAuthorized):
        rollout_cancel(actor=actor(lena), rollout=rollout)
    with pytest.raises(Conflict):
        rollout_cancel(actor=actor(alex), rollout=rollout)


# --- replicas already down -------------------------------------------------------


def mark_down(replica_url: str) -> None:
    Replica.objects.filter(base_url=replica_url).update(
        health="down", last_error="connection refused", last_checked_at=timezone.now()
    )


@pytest.fixture
def replicas_known(deployment):
    from serving.replica_rows import replicas_sync

    replicas_sync(deployment)


@pytest.mark.django_db
def test_a_replica_down_before_the_rollout_is_deferred_not_waited_for(
    lena, deployment, approved_v1, fake_replicas, replicas_known, settings
):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 90
    up, down = fake_replicas
    mark_down(down.base_url)
    rollout = promote(lena, deployment, approved_v1)

    started = time.monotonic()
    assert rollout_execute(rollout.pk, "w") == RolloutStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert down.requests == []
    assert up.adapters == {"legal-contracts": Rollout.objects.get().served_path}
    steps = {s.replica.base_url: s for s in rollout.replica_steps.select_related("replica")}
    assert steps[down.base_url].status == ReplicaStepStatus.DEFERRED
    assert steps[up.base_url].status == ReplicaStepStatus.SUCCEEDED

    body = client_for(lena).get(f"/api/v1/rollouts/{rollout.pk}/").json()
    assert body["replicas_summary"] == {
        "total": 2,
        "done": 1,
        "deferred": 1,
        "text": "1 of 2 replicas serve v1, 1 deferred (down)",
    }
    page = client_for(lena).get(f"/rollouts/{rollout.pk}/").content.decode()
    assert "1 of 2 replicas serve v1, 1 deferred (down)" in page


@pytest.mark.django_db
def test_the_reconcile_loads_and_verifies_a_deferred_replica_when_it_is_back(
    lena, deployment, approved_v1, fake_replicas, replicas_known
):
    up, down = fake_replicas
    mark_down(down.base_url)
    rollout = promote(lena, deployment, approved_v1)
    rollout_execute(rollout.pk, "w")
    rollout.refresh_from_db()

    report = reconcile_deployment(deployment.pk, "beat")  # the replica answers again

    assert down.adapters == {"legal-contracts": rollout.served_path}
    step = rollout.replica_steps.get(replica__base_url=down.base_url)
    assert step.status == ReplicaStepStatus.SUCCEEDED
    purposes = set(step.attempts.values_list("purpose", flat=True))
    assert {"verify_models", "verify_completion"} <= purposes
    assert any("deferred step" in line for line in report.repairs)
    body = client_for(lena).get(f"/api/v1/rollouts/{rollout.pk}/").json()
    assert body["replicas_summary"]["text"] == "2 of 2 replicas serve v1"


@pytest.mark.django_db
def test_a_deferred_replica_that_fails_verification_stays_deferred_with_the_reason(
    lena, deployment, approved_v1, fake_replicas, replicas_known
):
    up, down = fake_replicas
    mark_down(down.base_url)
    rollout = promote(lena, deployment, approved_v1)
    rollout_execute(rollout.pk, "w")
    down.fail_completion_for = {"legal-contracts"}

    reconcile_deployment(deployment.pk, "beat")

    step = rollout.replica_steps.get(replica__base_url=down.base_url)
    assert step.status == ReplicaStepStatus.DEFERRED
    assert "engine error" in step.error


@pytest.mark.django_db
def test_require_all_replicas_keeps_the_strict_behaviour(
    lena, root, deployment, approved_v1, fake_replicas, replicas_known
):
    from serving.services.deployments import deployment_update

    deployment_update(actor=actor(root), deployment=deployment, require_all_replicas=True)
    up, down = fake_replicas
    mark_down(down.base_url)
    down.unavailable = 10_000  # still down
    rollout = promote(lena, deployment, approved_v1)

    # Pushed to and retried until the deadline; the rollback cannot reach it either.
    assert rollout_execute(rollout.pk, "w") == RolloutStatus.FAILED
    rollout.refresh_from_db()
    assert rollout.error.startswith("Load failed on 1 replica(s)")
    assert len(down.requests) > 1
    assert "legal-contracts" not in up.adapters


@pytest.mark.django_db
def test_verification_failures_still_roll_back_with_a_replica_deferred(
    lena, deployment, approved_v1, fake_replicas, replicas_known
):
    up, down = fake_replicas
    mark_down(down.base_url)
    up.fail_completion_for = {"legal-contracts"}
    rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == RolloutStatus.ROLLED_BACK
    assert down.requests == []  # the rollback does not push to it either


# --- the state view ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_replica_found_down_is_never_in_sync(lena, root, deployment, approved_v1, fake_replicas):
    rollout_execute(promote(lena, deployment, approved_v1).pk, "w")
    mark_down(fake_replicas[0].base_url)  # what it listed before is stale now
    # A platform admin: members see replicas by number, not by URL.
    state = client_for(root).get(f"/api/v1/deployments/{deployment.name}/state/").json()
    by_url = {r["base_url"]: r["adapters"][0]["in_sync"] for r in state["replicas"]}
    assert by_url == {fake_replicas[0].base_url: False, fake_replicas[1].base_url: True}


@pytest.mark.django_db
def test_only_deferred_steps_of_the_served_version_cost_the_reconcile_a_look(
    lena, deployment, approved_v1, fake_replicas, replicas_known
):
    from serving.models import ServedAdapter
    from serving.replica_rows import replicas_sync

    up, down = fake_replicas
    mark_down(down.base_url)
    rollout_execute(promote(lena, deployment, approved_v1).pk, "w")

    def flagged():
        return {r.base_url for r in replicas_sync(deployment, with_deferred=True) if r.has_deferred}

    assert flagged() == {down.base_url}
    # A later version supersedes the step: it stays deferred, as the record, unflagged.
    ServedAdapter.objects.update(version=None, served_path="")
    assert flagged() == set()
