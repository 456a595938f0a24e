"""Each change the product tells about leaves one outbox row, in the
transaction of the change, with a versioned payload that names no secret and
no server path; and the right people, only they, are told."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from core.audit import audit_record
from notifications.events import KINDS, SCHEMA_VERSION
from notifications.models import Event
from registry.services.versions import version_transition
from serving.models import Rollout, RolloutKind, RolloutStatus
from serving.rollouts.steps import audit_ended
from serving.services.grants import grant_decide, grant_request, grant_revoke
from serving.services.inference_keys import inference_key_issue, inference_key_revoke
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version, make_version
from tests.notifications.conftest import fan_out_all, told
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts", served_name="legal-contracts")


def test_a_submitted_version_records_one_event_in_its_transaction(lena, contracts):
    version = make_version(lena, contracts, AdapterSpec(seed=1))
    assert not Event.objects.exists()  # registering tells nobody

    version_transition(actor=actor(lena), version=version, action="submit")

    (event,) = Event.objects.all()
    assert event.kind == "version.submitted"
    assert event.department.slug == "legal"
    assert event.payload["type"] == "version.submitted"
    assert event.payload["version"] == SCHEMA_VERSION
    assert event.payload["id"] == str(event.uid)
    assert event.payload["data"]["version"]["number"] == version.number
    assert event.payload["data"]["adapter"]["served_name"] == "legal-contracts"
    assert event.link == f"/versions/{version.pk}/"


def test_a_change_that_rolls_back_leaves_no_event(lena, contracts):
    version = make_version(lena, contracts, AdapterSpec(seed=2))
    with pytest.raises(RuntimeError), transaction.atomic():
        version_transition(actor=actor(lena), version=version, action="submit")
        raise RuntimeError("the change fails after its audit event")
    assert not Event.objects.exists()


def test_the_outbox_row_is_sent_to_the_worker_only_after_the_commit(
    lena, contracts, django_capture_on_commit_callbacks
):
    version = make_version(lena, contracts, AdapterSpec(seed=3))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        version_transition(actor=actor(lena), version=version, action="submit")
    assert Event.objects.filter(kind="version.submitted").exists()
    assert callbacks, "the fan-out is enqueued on commit"


def test_after_the_commit_the_fan_out_task_is_sent_with_the_events_id(
    lena, contracts, django_capture_on_commit_callbacks
):
    from unittest import mock

    from notifications.tasks import fan_out

    version = make_version(lena, contracts, AdapterSpec(seed=11))
    with (
        mock.patch.object(fan_out, "delay") as sent,
        django_capture_on_commit_callbacks(execute=True),
    ):
        version_transition(actor=actor(lena), version=version, action="submit")
    sent.assert_called_once_with(Event.objects.get().pk)


def test_a_broker_that_is_down_loses_no_event(lena, contracts, django_capture_on_commit_callbacks):
    from unittest import mock

    from notifications.tasks import fan_out

    version = make_version(lena, contracts, AdapterSpec(seed=12))
    with (
        mock.patch.object(fan_out, "delay", side_effect=ConnectionError("broker down")),
        django_capture_on_commit_callbacks(execute=True),
    ):
        version_transition(actor=actor(lena), version=version, action="submit")
    # The row stays for the sweeper (test_fan_out.py), and the change committed.
    assert Event.objects.filter(fanned_out_at__isnull=True).count() == 1


def test_approvers_are_told_a_version_waits_but_not_its_author_nor_outsiders(
    lena, alex, paula, fred, root, contracts
):
    version = make_version(lena, contracts, AdapterSpec(seed=4))
    version_transition(actor=actor(lena), version=version, action="submit")
    fan_out_all()
    assert told("version.submitted") == {"alex", "paula"}


def test_an_approver_who_submitted_is_not_asked_to_review_it(alex, paula, contracts):
    version = make_version(alex, contracts, AdapterSpec(seed=5))
    version_transition(actor=actor(alex), version=version, action="submit")
    fan_out_all()
    assert told("version.submitted") == {"paula"}


def test_owners_and_the_author_hear_that_a_version_was_approved_or_refused(
    lena, alex, paula, fred, contracts
):
    contracts.owners.add(paula)
    make_approved_version(lena, alex, contracts, AdapterSpec(seed=6))
    refused = make_version(lena, contracts, AdapterSpec(seed=7))
    version_transition(actor=actor(lena), version=refused, action="submit")
    version_transition(
        actor=actor(alex), version=refused, action="reject", comment="wrong base model"
    )
    fan_out_all()
    assert told("version.approved") == {"lena", "paula"}
    assert told("version.refused") == {"lena", "paula"}
    refusal = Event.objects.get(kind="version.refused")
    assert refusal.payload["data"]["comment"] == "wrong base model"
    assert refusal.payload["data"]["actor"] == "alex"


def test_nobody_is_told_about_a_department_they_cannot_see(lena, alex, fred, finance, contracts):
    # fred owns Legal's adapter by mistake; he is no member of Legal.
    contracts.owners.add(fred)
    make_approved_version(lena, alex, contracts, AdapterSpec(seed=8))
    fan_out_all()
    assert "fred" not in told("version.approved")


def test_a_rollout_that_failed_tells_owners_without_the_servers_paths(
    lena, alex, root, contracts, tmp_path
):
    from tests.serving.conftest import make_deployment

    version = make_approved_version(lena, alex, contracts, AdapterSpec(seed=9))
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=contracts,
        kind=RolloutKind.PROMOTE,
        target_version=version,
        status=RolloutStatus.FAILED,
        requested_by=alex,
        error="Staging failed: /srv/registry/secret-volume/legal-contracts",
    )
    with transaction.atomic():
        audit_ended(rollout, RolloutStatus.FAILED, rollout.error)
    fan_out_all()

    event = Event.objects.get(kind="rollout.failed")
    assert "/srv/registry" not in json.dumps(event.payload)
    assert event.payload["data"]["deployment"] == deployment.name
    assert event.payload["data"]["version"]["number"] == version.number
    assert told("rollout.failed") == {"lena", "alex"}  # the owner and who asked


def test_rolled_back_and_succeeded_rollouts_have_their_own_kinds(
    lena, alex, root, contracts, tmp_path
):
    from tests.serving.conftest import make_deployment

    version = make_approved_version(lena, alex, contracts, AdapterSpec(seed=10))
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    for status in (RolloutStatus.SUCCEEDED, RolloutStatus.ROLLED_BACK):
        rollout = Rollout.objects.create(
            deployment=deployment,
            adapter=contracts,
            kind=RolloutKind.PROMOTE,
            target_version=version,
            status=status,
        )
        with transaction.atomic():
            audit_ended(rollout, status, "")
    kinds = set(Event.objects.values_list("kind", flat=True))
    assert {"rollout.succeeded", "rollout.rolled_back"} <= kinds


@pytest.fixture
def hugo(db):
    """A member of HR, which asks Legal for a grant."""
    from django.contrib.auth import get_user_model

    from core.models import Department, Membership, Role

    hr = Department.objects.create(slug="hr", name="HR")
    user = get_user_model().objects.create_user("hugo", email="hugo@example.com")
    Membership.objects.create(user=user, department=hr, role=Role.MEMBER)
    user.hr = hr
    return user


def test_a_grant_request_asks_the_adapters_approvers_and_its_decision_tells_the_requester(
    lena, alex, paula, fred, hugo, contracts
):
    grant = grant_request(
        actor=actor(hugo),
        department=hugo.hr,
        served_name="legal-contracts",
        expires_in_days=30,
        reason="contract checks",
    )
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    grant_revoke(actor=actor(paula), grant=grant, comment="no longer needed")
    fan_out_all()

    assert told("grant.requested") == {"alex", "paula"}
    assert told("grant.approved") == {"hugo"}
    assert told("grant.revoked") == {"hugo"}
    event = Event.objects.get(kind="grant.approved")
    assert sorted(event.audience) == sorted([contracts.department_id, hugo.hr.pk])
    assert event.payload["data"]["grantee"] == "hr"


def test_a_refused_grant_tells_the_requester(alex, hugo, contracts):
    grant = grant_request(
        actor=actor(hugo),
        department=hugo.hr,
        served_name="legal-contracts",
        expires_in_days=30,
        reason="contract checks",
    )
    grant_decide(actor=actor(alex), grant=grant, approve=False, comment="not for HR")
    fan_out_all()
    assert told("grant.refused") == {"hugo"}


def test_the_asking_side_hears_the_same_whether_or_not_the_name_is_served(
    alex, paula, hugo, contracts
):
    """Issue 43: asking for a name nobody serves must not read differently to
    the asking department (its people, its webhooks) from asking for a served one."""
    from django.utils import timezone

    from serving.models import AdapterGrant
    from serving.services.grants import grants_expire

    def ask(name):
        return grant_request(
            actor=actor(hugo), department=hugo.hr, served_name=name, expires_in_days=30, reason="x"
        )

    served, unknown = ask("legal-contracts"), ask("legal-secrets")
    AdapterGrant.objects.update(expires_at=timezone.now())
    assert grants_expire() == 2
    fan_out_all()

    # The request waits for the adapter's department only; nobody for a name nobody serves.
    asked = Event.objects.get(kind="grant.requested")
    assert (asked.audience, asked.payload["data"]["grant"]["id"]) == (
        [contracts.department_id],
        served.pk,
    )
    assert told("grant.requested") == {"alex", "paula"}
    # Unanswered, both end alike for the asking side: same people, same payload but the name.
    ended = {
        e.payload["data"]["grant"]["id"]: e for e in Event.objects.filter(kind="grant.expired")
    }
    assert told("grant.expired") == {"hugo"}
    assert hugo.hr.pk in ended[served.pk].audience and ended[unknown.pk].audience == [hugo.hr.pk]

    def seen(event):
        body = json.loads(json.dumps(event.payload).replace("legal-secrets", "legal-contracts"))
        body["data"]["grant"].pop("id")
        return {k: v for k, v in body.items() if k not in ("id", "created_at")}

    assert seen(ended[unknown.pk]) == seen(ended[served.pk])
    assert seen(ended[served.pk])["department"] == "hr"


def test_a_revoked_key_tells_its_person_and_never_carries_its_secret(lena, alex, legal):
    key, secret = inference_key_issue(
        actor=actor(lena), department=legal, name="laptop", holder="person", expires_in_days=30
    )
    inference_key_revoke(actor=actor(alex), key=key, reason="leaked")
    fan_out_all()

    event = Event.objects.get(kind="key.revoked")
    assert secret not in json.dumps(event.payload)
    assert event.payload["data"]["reason"] == "leaked"
    assert told("key.revoked") == {"lena"}


def test_a_department_key_revoked_tells_the_departments_approvers(alex, paula, legal):
    key, _ = inference_key_issue(
        actor=actor(alex), department=legal, name="frontend", holder="department", expires_in_days=9
    )
    inference_key_revoke(actor=actor(alex), key=key, reason="rotated")
    fan_out_all()
    assert told("key.revoked") == {"alex", "paula"}


def test_audit_events_of_other_kinds_tell_nobody(lena, legal):
    audit_record(actor=actor(lena), action="department.updated", obj=legal, department=legal)
    assert not Event.objects.exists()


def test_every_kind_in_the_catalog_has_a_summary_and_a_default():
    assert KINDS
    for kind in KINDS.values():
        assert kind.summary
        assert kind.default in ("email", "in_app")


def test_a_fault_reading_an_event_tells_nobody_and_keeps_the_change(lena, contracts, caplog):
    from unittest import mock

    from registry.models import VersionStatus

    version = make_version(lena, contracts, AdapterSpec(seed=13))
    with mock.patch("notifications.events.reverse", side_effect=RuntimeError("a bug")):
        version_transition(actor=actor(lena), version=version, action="submit")
    version.refresh_from_db()
    assert version.status == VersionStatus.PENDING_REVIEW
    assert not Event.objects.exists()
    assert "cannot read version.submit" in caplog.text
