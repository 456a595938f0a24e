"""core.claims against the database: one holder at a time, expiry frees the
row, renewal and release only by the owner."""

import time

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
    Heartbeat(LEASE, deployment.pk, "worker-a", 0.3).sleep(0.9)
    assert not LEASE.claim(deployment.pk, "worker-b", 30)


def test_a_heartbeat_stops_work_whose_claim_was_lost(deployment):
    LEASE.claim(deployment.pk, "worker-a", 0.05)
    time.sleep(0.1)
    LEASE.claim(deployment.pk, "worker-b", 30)
    with pytest.raises(LeaseLost):
        Heartbeat(LEASE, deployment.pk, "worker-a", 0.05).beat(force=True)
