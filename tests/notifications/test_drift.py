"""Drift the reconcile cannot repair itself is a platform event: platform
admins are told once per new drift (a repeat is counted, not told again)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from notifications.models import Event
from serving.models import DriftKind, Replica
from serving.records.drifts import DriftRecorder
from tests.notifications.conftest import fan_out_all, told
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def replica(root, tmp_path):
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    return Replica.objects.create(deployment=deployment, base_url="http://127.0.0.1:9")


def record(replica, kind, detail="stale weights"):
    drifts = DriftRecorder(replica.deployment)
    drifts.add(replica, kind, adapter_name="legal-contracts", detail=detail)
    drifts.flush(timezone.now())


def test_a_stale_replica_tells_the_platform_admins_only(replica, root, lena, alex):
    record(replica, DriftKind.FINGERPRINT_MISMATCH)
    fan_out_all()
    event = Event.objects.get(kind="drift.found")
    assert event.department is None
    assert event.payload["data"]["drift"]["kind"] == "fingerprint_mismatch"
    assert event.link == f"/deployments/{replica.deployment.name}/"
    assert told("drift.found") == {"root"}


def test_the_same_drift_seen_again_is_not_told_again(replica, root):
    record(replica, DriftKind.REPAIR_FAILED)
    record(replica, DriftKind.REPAIR_FAILED)
    assert Event.objects.filter(kind="drift.found").count() == 1


def test_a_repair_that_worked_tells_nobody(replica, root):
    record(replica, DriftKind.MISSING_RELOADED, detail="")
    assert not Event.objects.exists()
