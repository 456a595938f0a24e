"""core.claims against the database: one holder at a time, expiry frees the
row, renewal and release only by the owner."""

import time
from datetime import timedelta
from types import SimpleNamespace
from unittest import mock

import pytest

from core.claims import Heartbeat, Lease, LeaseLost
from serving.models import Deployment

pytestmark = pytest.mark.django_db

LEASE = Lease(Deployment, "reconcile_lease_owner", "reconcile_lease_until")


@pytest.fixture
def deployment():
    return Deployment.objects.create(name="claims-test", base_model_name="tiny")


def test_a_held_claim_refuses_a_second_owner(deployment):
    assert LEASE.claim(deployment.pk, "worker-a", 30)
    assert not LEASE.claim(deployment.pk, "worker-b", 30)
    # The holder itself may claim again: a redelivered task resumes its own work.
    assert LEASE.claim(deployment.pk, "worker-a", 30)


def test_an_expired_claim_is_free_for_the_next_worker(deployment):
    assert LEASE.claim(deployment.pk, "worker-a", 0.05)
    time.sleep(0.1)
    assert LEASE.claim(deployment.pk, "worker-b", 30)
    assert not LEASE.renew(deployment.pk, "worker-a", 30)


def test_only_the_owner_renews_or_releases(deployment):
    LEASE.claim(deployment.pk, "worker-a", 30)
    assert not LEASE.release(deployment.pk, "worker-b")
    assert not LEASE.renew(deployment.pk, "worker-b", 30)
    assert not LEASE.claim(deployment.pk, "worker-b", 30)
    assert LEASE.release(deployment.pk, "worker-a")
    assert LEASE.claim(deployment.pk, "worker-b", 30)


def test_free_rows_are_found_by_the_sweeper_query(deployment):
    other = Deployment.objects.create(name="claims-other", base_model_name="tiny")
    LEASE.claim(deployment.pk, "worker-a", 30)
    free = set(Deployment.objects.filter(LEASE.free()).values_list("pk", flat=True))
    assert other.pk in free and deployment.pk not in free


def test_a_heartbeat_keeps_a_short_claim_through_a_long_wait(deployment):
    LEASE.claim(deployment.pk, "worker-a", 0.3)
    first_end = Deployment.objects.get(pk=deployment.pk).reconcile_lease_until
    Heartbeat(LEASE, deployment.pk, "worker-a", 0.3).sleep(0.9)
    # Still held well into the wait, long after the claim's first end: asked as
    # of then, not of now, as the light run (niced beside vLLM) may stall right
    # after the last renewal for longer than a 0.3 s claim.
    well_into_the_wait = first_end + timedelta(seconds=0.5)
    with mock.patch("core.claims.timezone.now", return_value=well_into_the_wait):
        assert not LEASE.claim(deployment.pk, "worker-b", 30)


def test_a_heartbeat_stops_work_whose_claim_was_lost(deployment):
    LEASE.claim(deployment.pk, "worker-a", 0.05)
    time.sleep(0.1)
    LEASE.claim(deployment.pk, "worker-b", 30)
    with pytest.raises(LeaseLost):
        Heartbeat(LEASE, deployment.pk, "worker-a", 0.05).beat(force=True)


def test_a_heartbeat_rides_out_a_database_error_but_never_past_its_claim(deployment):
    from django.db import OperationalError

    # The heartbeat's own clock, moved by hand: on the wall clock, a stall of the
    # light run (niced beside vLLM) between two lines made "a moment after" late.
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep)
    now = [1000.0]
    LEASE.claim(deployment.pk, "worker-a", 0.6)
    with mock.patch("core.claims.time", clock):
        heartbeat = Heartbeat(LEASE, deployment.pk, "worker-a", 0.6)
        dropped = OperationalError("server closed the connection unexpectedly")
        with mock.patch.object(Lease, "renew", side_effect=dropped):
            now[0] += 0.05
            heartbeat.beat(force=True)  # a moment after the last renewal: try again later
            now[0] += 0.4  # two thirds of the claim gone: someone may take it soon
            with pytest.raises(LeaseLost):
                heartbeat.beat(force=True)
        heartbeat.beat(force=True)  # the database is back and the claim still ours


def test_many_rows_are_claimed_renewed_and_released_together():
    rows = [Deployment.objects.create(name=f"many-{i}", base_model_name="tiny") for i in range(4)]
    ids = [r.pk for r in rows]
    assert LEASE.claim(ids[0], "other", 30)

    held = LEASE.claim_many(ids, "worker-a", 30)

    assert held == set(ids[1:])  # the row someone else holds is left to them
    assert LEASE.claim_many(ids, "worker-a", 30) == set(ids[1:])  # ours again: still ours
    assert LEASE.renew_many(ids, "worker-a", 60) == 3
    assert LEASE.release_many(ids, "worker-a") == 3
    assert Deployment.objects.filter(reconcile_lease_owner="").count() == 3
    assert Deployment.objects.get(pk=ids[0]).reconcile_lease_owner == "other"


def test_a_release_can_set_other_columns_in_the_same_update(deployment):
    from django.utils import timezone

    LEASE.claim(deployment.pk, "worker-a", 30)
    now = timezone.now()
    assert not LEASE.release(deployment.pk, "worker-b", last_reconciled_at=now)
    assert Deployment.objects.get(pk=deployment.pk).last_reconciled_at is None
    assert LEASE.release(deployment.pk, "worker-a", last_reconciled_at=now)
    assert Deployment.objects.get(pk=deployment.pk).last_reconciled_at == now
