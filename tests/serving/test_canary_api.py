"""Starting a traffic canary (a promotion with a share and a bake time), and a
person's promote-now or abort while it bakes: who may, and what is refused."""

from __future__ import annotations

import pytest

from core.models import AuditEvent
from serving.models import Canary, CanaryState, Promotion, Rollout, RolloutStatus, ServedAdapter
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create, promotion_review
from tests.conftest import actor
from tests.support.authorization import CALLERS, caller_client

pytestmark = pytest.mark.django_db

TEN_FOR_30 = {"share": 10, "bake_seconds": 30}


@pytest.fixture
def front_door(settings, deployment, tmp_path):
    # A front door that is configured but not running: its files are written.
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:1"}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"


@pytest.fixture
def served_v1(lena, deployment, approved_v1, front_door):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(promotion.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    return approved_v1


def promote(client, deployment, version, **extra):
    body = {"deployment": deployment.name, "version": version.pk, **extra}
    return client.post("/api/v1/promotions/", body, format="json")


@pytest.mark.parametrize(
    "canary",
    [
        {"share": 10},
        {"bake_seconds": 30},
        {"share": 0, "bake_seconds": 30},
        {"share": 51, "bake_seconds": 30},
        {"share": 10, "bake_seconds": 0},
        {"share": 10, "bake_seconds": 3601},
        {"share": "a tenth", "bake_seconds": 30},
        "ten percent",
    ],
)
def test_a_bad_share_or_bake_is_a_400_naming_the_field(
    as_lena, deployment, served_v1, approved_v2, canary
):
    response = promote(as_lena, deployment, approved_v2, traffic_canary=canary)
    assert response.status_code == 400, response.content
    assert "traffic_canary" in response.json()["error"]["details"]["fields"], response.json()
    assert not Rollout.objects.filter(target_version=approved_v2).exists()


def test_a_canary_without_a_front_door_is_refused(as_lena, lena, deployment, approved_v1):
    response = promote(as_lena, deployment, approved_v1, traffic_canary=TEN_FOR_30)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "canary_not_possible"
    assert "has no front door" in error["message"]


def test_a_canary_of_a_first_version_is_refused(as_lena, deployment, approved_v1, front_door):
    response = promote(as_lena, deployment, approved_v1, traffic_canary=TEN_FOR_30)
    assert response.status_code == 409
    assert "no old version to compare with" in response.json()["error"]["message"]


def test_a_canary_on_one_replica_is_refused(as_lena, deployment, served_v1, approved_v2):
    deployment.replicas.filter(pk=deployment.replicas.order_by("pk").first().pk).update(
        active=False
    )
    response = promote(as_lena, deployment, approved_v2, traffic_canary=TEN_FOR_30)
    assert response.status_code == 409
    assert "has 1 replica(s)" in response.json()["error"]["message"]


def test_a_canary_of_an_adapter_placed_on_one_replica_is_refused(
    as_lena, deployment, served_v1, approved_v2
):
    # Two replicas, but placement holds the adapter on one (max_replicas 1): the
    # rollout would push to that one only, leaving no old version to compare with.
    ServedAdapter.objects.filter(deployment=deployment, adapter=approved_v2.adapter).update(
        max_replicas=1
    )
    response = promote(as_lena, deployment, approved_v2, traffic_canary=TEN_FOR_30)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "canary_not_possible"
    assert "on 1 replica (max_replicas)" in error["message"]
    assert not Rollout.objects.filter(target_version=approved_v2).exists()


def test_a_canary_promotion_records_its_share_and_bake(as_lena, deployment, served_v1, approved_v2):
    response = promote(as_lena, deployment, approved_v2, traffic_canary=TEN_FOR_30)
    assert response.status_code == 201, response.content
    assert (response.json()["canary_share"], response.json()["canary_bake_seconds"]) == (10, 30)
    rollout = Rollout.objects.get(pk=response.json()["rollout"])
    assert (rollout.canary is not None, rollout.canary.share, rollout.canary.bake_seconds) == (
        True,
        10,
        30,
    )
    body = as_lena.get(f"/api/v1/rollouts/{rollout.pk}/").json()
    assert body["canary_split"]["share"] == 10
    assert body["canary_split"]["seconds_left"] is None  # not baking yet
    event = AuditEvent.objects.get(action="rollout.swap", object_id=str(rollout.pk))
    assert event.details["canary_share"] == 10


def test_a_canary_awaiting_approval_keeps_its_split_until_it_is_approved(
    lena, alex, deployment, served_v1, approved_v2
):
    deployment.requires_promotion_approval = True
    deployment.save()
    promotion = promotion_create(
        actor=actor(lena),
        deployment=deployment,
        version=approved_v2,
        canary_share=20,
        canary_bake_seconds=60,
    )
    assert not promotion.rollouts.exists()
    promotion_review(actor=actor(alex), promotion=promotion, approve=True)
    rollout = Promotion.objects.get(pk=promotion.pk).rollouts.get()
    assert (rollout.canary.share, rollout.canary.bake_seconds) == (20, 60)


def _baking(lena, deployment, approved_v2) -> Rollout:
    promotion = promotion_create(
        actor=actor(lena),
        deployment=deployment,
        version=approved_v2,
        canary_share=10,
        canary_bake_seconds=60,
    )
    rollout = promotion.rollouts.get()
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.BAKING)
    Canary.objects.filter(rollout=rollout).update(state=CanaryState.BAKING)
    return rollout


@pytest.mark.parametrize("path", ["promote-now", "abort-canary"])
@pytest.mark.parametrize(
    "caller,expected", list(zip(CALLERS, [401, 404, 403, 202, 403, 202], strict=True))
)
def test_only_approvers_decide_a_baking_canary(
    caller, expected, path, deployment, served_v1, approved_v2, fred, lena, alex, root, legal_token
):
    rollout = _baking(lena, deployment, approved_v2)
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    response = client.post(f"/api/v1/rollouts/{rollout.pk}/{path}/", {}, format="json")
    assert response.status_code == expected, response.content
    rollout.refresh_from_db()
    wanted = {"promote-now": "promote", "abort-canary": "abort"}[path]
    assert rollout.canary.requested == (wanted if expected == 202 else "")
    if expected == 202:
        assert response.json()["canary_split"]["requested"] == wanted
        assert AuditEvent.objects.filter(action=f"rollout.canary_{wanted}_requested").exists()


def test_a_canary_is_decided_once_and_only_while_it_bakes(
    as_alex, lena, deployment, served_v1, approved_v2
):
    rollout = _baking(lena, deployment, approved_v2)
    assert as_alex.post(f"/api/v1/rollouts/{rollout.pk}/abort-canary/").status_code == 202
    again = as_alex.post(f"/api/v1/rollouts/{rollout.pk}/promote-now/")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "canary_not_baking"
    assert "abort asked" in again.json()["error"]["message"]
    first = Rollout.objects.filter(target_version=served_v1).get()
    not_a_canary = as_alex.post(f"/api/v1/rollouts/{first.pk}/promote-now/")
    assert not_a_canary.status_code == 409
    assert "status succeeded" in not_a_canary.json()["error"]["message"]
