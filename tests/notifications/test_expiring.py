"""A key or a grant that ends within 7 days is told once, to whom it concerns."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import Event
from notifications.services.expiring import expiring_record
from serving.models import AdapterGrant, InferenceKey
from serving.services.grants import grant_decide, grant_request
from serving.services.inference_keys import inference_key_issue
from tests.conftest import actor
from tests.factories import make_adapter
from tests.notifications.conftest import fan_out_all, told

pytestmark = pytest.mark.django_db


def test_a_persons_key_that_expires_within_7_days_is_told_to_them_once(lena, legal):
    soon, _ = inference_key_issue(
        actor=actor(lena), department=legal, name="laptop", holder="person", expires_in_days=5
    )
    inference_key_issue(
        actor=actor(lena), department=legal, name="later", holder="person", expires_in_days=30
    )
    assert expiring_record() == 1
    assert expiring_record() == 0  # told once
    fan_out_all()
    assert told("key.expiring") == {"lena"}
    event = Event.objects.get(kind="key.expiring")
    assert event.payload["data"]["key"]["id"] == soon.pk


def test_a_key_whose_end_moved_is_told_again_and_a_revoked_one_never(lena, legal):
    key, _ = inference_key_issue(
        actor=actor(lena), department=legal, name="laptop", holder="person", expires_in_days=5
    )
    expiring_record()
    InferenceKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() + timedelta(days=6))
    assert expiring_record() == 1
    InferenceKey.objects.filter(pk=key.pk).update(
        revoked_at=timezone.now(), expires_at=timezone.now() + timedelta(days=4)
    )
    assert expiring_record() == 0


def test_a_grant_that_ends_soon_tells_its_requester_and_the_callers_approvers(
    lena, alex, legal, finance, fred
):
    from core.models import Membership, Role

    make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    Membership.objects.filter(user=fred).update(role=Role.MEMBER)
    grant = grant_request(
        actor=actor(fred),
        department=finance,
        served_name="legal-contracts",
        expires_in_days=3,
        reason="invoices",
    )
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    assert AdapterGrant.objects.get(pk=grant.pk).status == "approved"
    assert expiring_record() == 1
    fan_out_all()
    assert told("grant.expiring") == {"fred"}
