"""core.state.move: a status change is a compare-and-swap on the old status."""

import pytest

from core.errors import Conflict
from core.state import can_move, move
from serving.models import Deployment, Rollout, RolloutStatus
from serving.rules.transitions import ROLLOUT_TRANSITIONS
from tests.factories import make_adapter, make_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def rollout(lena, legal):
    contracts = make_adapter(lena, legal)
    version = make_version(lena, contracts)
    deployment = Deployment.objects.create(name="state-test", base_model_name="tiny")
    return Rollout.objects.create(
        deployment=deployment, adapter=contracts, target_version=version, kind="promote"
    )


def test_the_table_allows_staying_and_listed_moves_only():
    assert can_move(ROLLOUT_TRANSITIONS, RolloutStatus.PENDING, RolloutStatus.PENDING)
    assert can_move(ROLLOUT_TRANSITIONS, RolloutStatus.PENDING, RolloutStatus.STAGING)
    assert not can_move(ROLLOUT_TRANSITIONS, RolloutStatus.SUCCEEDED, RolloutStatus.LOADING)


def test_a_move_from_a_stale_status_changes_nothing(rollout):
    stale = Rollout.objects.get(pk=rollout.pk)
    assert move(rollout, ROLLOUT_TRANSITIONS, RolloutStatus.STAGING)
    # `stale` still believes the rollout is pending: its move must not land.
    assert not move(stale, ROLLOUT_TRANSITIONS, RolloutStatus.FAILED, error="late")
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.STAGING and rollout.error == ""


def test_a_move_the_table_forbids_is_a_conflict(rollout):
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.SUCCEEDED)
    rollout.refresh_from_db()
    with pytest.raises(Conflict) as raised:
        move(rollout, ROLLOUT_TRANSITIONS, RolloutStatus.LOADING)
    assert raised.value.code == "invalid_transition"
