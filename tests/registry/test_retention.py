"""Archived versions' artifacts are deleted after their department's retention
(registry/services/retention.py), audited; nothing else is ever deleted."""

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import AuditEvent
from core.services.departments import department_update
from registry.artifact_store import get_artifact_store
from registry.services.retention import retention_apply
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


def _archived(lena, alex, adapter, seed):
    version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=seed))
    version_transition(actor=actor(alex), version=version, action="deprecate")
    return version_transition(actor=actor(alex), version=version, action="archive")


def _stored(version) -> list[str]:
    return list(get_artifact_store().list_prefix(version.storage_prefix))


def test_archived_artifacts_go_after_the_retention_and_the_row_and_audit_stay(
    lena, alex, root, legal, contracts
):
    department_update(actor=actor(root), department=legal, artifact_retention_days=30)
    archived = _archived(lena, alex, contracts, seed=1)
    kept = make_approved_version(lena, alex, contracts, AdapterSpec(seed=2))
    assert _stored(archived) and _stored(kept)

    assert retention_apply(now=timezone.now() + timedelta(days=29)) == 0
    assert _stored(archived)

    assert retention_apply(now=timezone.now() + timedelta(days=31)) == 1
    archived.refresh_from_db()
    assert archived.artifacts_deleted_at is not None and archived.files  # the record stays
    assert not _stored(archived)
    assert _stored(kept)  # approved: never deleted
    event = AuditEvent.objects.get(action="version.artifacts_deleted")
    assert event.object_id == str(archived.pk) and "30 days" in event.comment
    # Once only.
    assert retention_apply(now=timezone.now() + timedelta(days=60)) == 0
    assert AuditEvent.objects.filter(action="version.artifacts_deleted").count() == 1


def test_without_a_retention_archived_artifacts_are_kept(lena, alex, contracts):
    archived = _archived(lena, alex, contracts, seed=1)
    assert retention_apply(now=timezone.now() + timedelta(days=3650)) == 0
    assert _stored(archived)


def test_setting_the_retention_is_for_platform_admins_and_audited(alex, root, legal):
    from core.errors import ApplicationError

    with pytest.raises(ApplicationError):
        department_update(actor=actor(alex), department=legal, artifact_retention_days=1)
    department_update(actor=actor(root), department=legal, artifact_retention_days=90)
    event = AuditEvent.objects.filter(action="department.updated").latest("id")
    assert event.details == {"artifact_retention_days": [None, 90]}
