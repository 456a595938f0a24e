"""POST /doors/<deployment>/ack with a peers address: the answer lists the
live doors that gave one (docs/door.md#peers), and an address that could
not stand in HAProxy's configuration is refused before it is stored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from serving.api.doors import door_token
from serving.models import DoorInstance

pytestmark = pytest.mark.django_db


@pytest.fixture
def doors(settings, deployment):
    settings.SERVING_DOORS = {deployment.name: "pull"}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {door_token(deployment.name)}")

    def ack(door: str, peer_address="", generation: int = 0):
        return client.post(
            f"/doors/{deployment.name}/ack",
            {"door": door, "generation": generation, "busy": 0, "peer_address": peer_address},
            content_type="application/json",
        )

    return ack


def test_each_door_is_told_the_live_doors_that_gave_a_peers_address(doors, deployment):
    assert doors("door-a", "10.0.0.7:10010").json() == {
        "peers": [{"name": "door-a", "address": "10.0.0.7:10010"}]
    }
    doors("door-c")  # a door with fixed peers (DOOR_PEERS), or none: not listed
    answer = doors("door-b", "10.0.0.8:10010")
    assert answer.status_code == 200
    assert answer.json()["peers"] == [
        {"name": "door-a", "address": "10.0.0.7:10010"},
        {"name": "door-b", "address": "10.0.0.8:10010"},
    ]
    # A door not heard from past its lease is dropped from the list.
    DoorInstance.objects.filter(deployment=deployment, name="door-a").update(
        seen_at=timezone.now() - timedelta(minutes=5)
    )
    assert doors("door-b", "10.0.0.8:10010").json()["peers"] == [
        {"name": "door-b", "address": "10.0.0.8:10010"}
    ]


@pytest.mark.parametrize(
    "address",
    ["10.0.0.7", "10.0.0.7:10010\n    peer evil 6.6.6.6:1", "a b:1", ":10010", 10010],
)
def test_an_address_that_is_not_host_and_port_is_refused(doors, deployment, address):
    answer = doors("door-a", address)
    assert answer.status_code == 400
    assert "peer_address" in answer.json()["detail"]
    assert not DoorInstance.objects.filter(deployment=deployment).exists()


@pytest.mark.parametrize("address", ["[fd00::7]:10010", "fd00::7:10010"])
def test_an_ipv6_address_is_taken(doors, address):
    # Both forms are valid in HAProxy's peers section (haproxy -c).
    assert doors("door-a", address).json()["peers"] == [{"name": "door-a", "address": address}]
