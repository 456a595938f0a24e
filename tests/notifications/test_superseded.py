"""A promotion that succeeded tells the people of the version it replaced
that it is superseded there; a rollback supersedes nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from notifications.models import Event
from serving.models import Rollout, RolloutKind, RolloutStatus
from serving.rollouts.steps import audit_ended
from tests.factories import make_adapter, make_approved_version
from tests.notifications.conftest import fan_out_all, told
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(lena, alex, legal):
    contracts = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    old = make_approved_version(lena, alex, contracts, AdapterSpec(seed=31))
    new = make_approved_version(lena, alex, contracts, AdapterSpec(seed=32))
    return contracts, old, new


def end(root, tmp_path, contracts, old, new, kind, status=RolloutStatus.SUCCEEDED):
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=contracts,
        kind=kind,
        target_version=new,
        previous_version=old,
        status=status,
    )
    with transaction.atomic():
        audit_ended(rollout, status, "")
    return deployment


def test_a_promotion_that_succeeded_supersedes_the_version_it_replaced(
    root, lena, alex, fred, versions, tmp_path
):
    contracts, old, new = versions
    deployment = end(root, tmp_path, contracts, old, new, RolloutKind.PROMOTE)
    fan_out_all()

    event = Event.objects.get(kind="version.superseded")
    data = event.payload["data"]
    assert data["version"]["id"] == old.pk
    assert data["superseded_by"] == {"id": new.pk, "number": new.number}
    assert data["deployment"] == deployment.name
    assert event.link == f"/versions/{old.pk}/"
    assert event.department.slug == "legal"
    assert str(deployment.volume_write_path) not in event.payload.__repr__()
    assert told("version.superseded") == {"lena"}  # its owner and author, no outsider
    assert Event.objects.filter(kind="rollout.succeeded").count() == 1


def test_a_rollback_supersedes_nothing(root, versions, tmp_path):
    contracts, old, new = versions
    end(root, tmp_path, contracts, new, old, RolloutKind.ROLLBACK)
    assert Event.objects.filter(kind="rollout.succeeded").exists()
    assert not Event.objects.filter(kind="version.superseded").exists()


def test_a_failed_promotion_supersedes_nothing(root, versions, tmp_path):
    contracts, old, new = versions
    end(root, tmp_path, contracts, old, new, RolloutKind.PROMOTE, RolloutStatus.FAILED)
    assert not Event.objects.filter(kind="version.superseded").exists()
