"""GET /api/v1/notifications/ and the choices: what a person reads and sets."""

from __future__ import annotations

import pytest

from notifications.models import Notification
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version, make_version
from tests.notifications.conftest import fan_out_all
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_for_lena(lena, alex, legal):
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    make_approved_version(lena, alex, adapter, AdapterSpec(seed=41))
    refused = make_version(lena, adapter, AdapterSpec(seed=42))
    version_transition(actor=actor(lena), version=refused, action="submit")
    version_transition(actor=actor(alex), version=refused, action="reject", comment="no")
    fan_out_all()
    return list(Notification.objects.filter(user=lena).order_by("id"))


def test_a_person_lists_their_notifications_newest_first(as_lena, two_for_lena):
    body = as_lena.get("/api/v1/notifications/").json()
    assert body["count"] == 2
    assert [n["kind"] for n in body["results"]] == ["version.refused", "version.approved"]
    first = body["results"][0]
    assert first["read"] is False
    assert first["link"].startswith("/versions/")
    assert first["payload"]["type"] == "version.refused"


def test_marking_one_read_keeps_it_out_of_the_unread_ones(as_lena, two_for_lena):
    one = two_for_lena[0]
    response = as_lena.post(f"/api/v1/notifications/{one.pk}/read/")
    assert response.status_code == 200
    assert response.json()["read"] is True
    unread = as_lena.get("/api/v1/notifications/", {"unread": "true"}).json()
    assert [n["id"] for n in unread["results"]] == [two_for_lena[1].pk]
    read = as_lena.get("/api/v1/notifications/", {"unread": "false"}).json()
    assert [n["id"] for n in read["results"]] == [one.pk]


def test_read_all_says_how_many_were_unread(as_lena, two_for_lena):
    assert as_lena.post("/api/v1/notifications/read-all/").json() == {"marked": 2}
    assert as_lena.post("/api/v1/notifications/read-all/").json() == {"marked": 0}


def test_an_unread_filter_that_is_not_a_boolean_is_a_400(as_lena):
    response = as_lena.get("/api/v1/notifications/", {"unread": "yes"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_unread"


def test_preferences_list_every_kind_with_its_default(as_lena):
    rows = as_lena.get("/api/v1/notification-preferences/").json()
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["version.submitted"]["channel"] == "email"
    assert by_kind["rollout.succeeded"]["channel"] == "in_app"


def test_a_choice_is_kept_and_listed(as_lena):
    response = as_lena.post(
        "/api/v1/notification-preferences/",
        {"kind": "rollout.succeeded", "channel": "off"},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["channel"] == "off"
    rows = as_lena.get("/api/v1/notification-preferences/").json()
    assert {r["kind"]: r["channel"] for r in rows}["rollout.succeeded"] == "off"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "version.eaten", "channel": "off"}, "kind"),
        ({"kind": "version.approved", "channel": "pigeon"}, "channel"),
    ],
)
def test_an_unknown_kind_or_channel_is_a_400_naming_it(as_lena, body, field):
    response = as_lena.post("/api/v1/notification-preferences/", body, format="json")
    assert response.status_code == 400
    assert field in response.content.decode()
