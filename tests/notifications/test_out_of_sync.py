"""A replica out of sync past the bound is a platform event, told once per
episode: back in sync ends the episode, and a new one is told again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import Event, SyncEpisode
from notifications.services.out_of_sync import OUT_OF_SYNC_AFTER_SECONDS, out_of_sync_record
from serving.models import Replica, ReplicaHealth
from tests.notifications.conftest import fan_out_all, told
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db

BOUND = timedelta(seconds=OUT_OF_SYNC_AFTER_SECONDS)


@pytest.fixture
def replica(root, tmp_path):
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    now = timezone.now()
    return Replica.objects.create(
        deployment=deployment,
        base_url="http://10.1.2.3:8000",
        health=ReplicaHealth.UP,
        last_checked_at=now,
        in_sync_since=now,
    )


def drift(replica):
    """As the reconcile's write does for a replica it had to repair or found down."""
    Replica.objects.filter(pk=replica.pk).update(in_sync_since=None, health=ReplicaHealth.DOWN)


def heal(replica):
    Replica.objects.filter(pk=replica.pk).update(
        in_sync_since=timezone.now(), health=ReplicaHealth.UP
    )


def test_a_replica_in_sync_tells_nobody(replica, root):
    assert out_of_sync_record() == 0
    assert not SyncEpisode.objects.exists()


def test_out_of_sync_past_the_bound_tells_the_platform_admins_once(replica, root, alex):
    drift(replica)
    start = timezone.now()
    assert out_of_sync_record(start) == 0
    assert out_of_sync_record(start + BOUND - timedelta(seconds=1)) == 0
    assert out_of_sync_record(start + BOUND) == 1
    assert out_of_sync_record(start + BOUND * 3) == 0  # the same episode

    fan_out_all()
    event = Event.objects.get(kind="replica.out_of_sync")
    assert event.department is None
    assert event.payload["data"]["deployment"] == replica.deployment.name
    assert event.payload["data"]["replica"] == {"id": replica.pk, "health": "down"}
    # The replica's address is the server's business, not the event's.
    assert replica.base_url not in str(event.payload)
    assert told("replica.out_of_sync") == {"root"}


def test_back_in_sync_ends_the_episode_and_the_next_one_is_told_again(replica, root):
    drift(replica)
    start = timezone.now()
    out_of_sync_record(start)
    assert out_of_sync_record(start + BOUND) == 1
    heal(replica)
    out_of_sync_record(start + BOUND * 2)
    assert not SyncEpisode.objects.exists()
    drift(replica)
    out_of_sync_record(start + BOUND * 3)
    assert out_of_sync_record(start + BOUND * 4) == 1
    assert Event.objects.filter(kind="replica.out_of_sync").count() == 2


def test_a_short_blip_tells_nobody(replica, root):
    drift(replica)
    start = timezone.now()
    out_of_sync_record(start)
    heal(replica)
    out_of_sync_record(start + timedelta(seconds=30))
    assert out_of_sync_record(start + BOUND * 2) == 0
    assert not Event.objects.exists()


def test_an_inactive_replica_is_not_watched(replica, root):
    drift(replica)
    Replica.objects.filter(pk=replica.pk).update(active=False)
    start = timezone.now()
    out_of_sync_record(start)
    assert out_of_sync_record(start + BOUND) == 0
