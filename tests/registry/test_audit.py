"""The audit log is append-only everywhere (ORM, database, admin), records who,
from where and why, and is visible only within the department it belongs to."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory

from core.audit import audit_record
from core.models import AuditEvent
from registry.services.versions import version_transition
from tests.conftest import actor, requires_postgres
from tests.factories import make_adapter, make_version

pytestmark = pytest.mark.django_db

EVENTS = "/api/v1/audit-events/"


@pytest.fixture
def event(lena, legal):
    return audit_record(actor=actor(lena), action="test.event", obj=legal, department=legal)


def test_saving_an_existing_event_is_refused(event):
    event.comment = "rewritten"
    with pytest.raises(PermissionError):
        event.save()
    event.refresh_from_db()
    assert event.comment == ""


def test_deleting_an_event_is_refused(event):
    with pytest.raises(PermissionError):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_queryset_update_and_delete_are_refused(event):
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(pk=event.pk).update(comment="x")
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get(pk=event.pk).comment == ""


@pytest.mark.postgres
@requires_postgres()
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE registry_auditevent SET comment = 'forged' WHERE id = %s",
        "DELETE FROM registry_auditevent WHERE id = %s",
    ],
)
def test_postgres_trigger_refuses_raw_update_and_delete(event, sql):
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).comment == ""


def test_admin_offers_no_add_change_or_delete(event, root, as_root):
    model_admin = site._registry[AuditEvent]
    request = RequestFactory().get("/admin/core/auditevent/")
    request.user = root
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, event)
    assert not model_admin.has_delete_permission(request, event)
    assert model_admin.get_actions(request) == {}

    changelist = as_root.get("/admin/core/auditevent/")
    assert changelist.status_code == 200
    assert b"delete_selected" not in changelist.content
    assert as_root.get("/admin/core/auditevent/add/").status_code == 403
    assert as_root.post(f"/admin/core/auditevent/{event.pk}/delete/").status_code == 403
    detail = as_root.post(f"/admin/core/auditevent/{event.pk}/change/", {"comment": "forged"})
    assert detail.status_code == 403
    assert AuditEvent.objects.get(pk=event.pk).comment == ""


def test_a_transition_records_actor_request_address_states_and_comment(lena, alex, legal, as_alex):
    version = make_version(lena, make_adapter(lena, legal))
    version_transition(actor=actor(lena), version=version, action="submit")

    response = as_alex.post(
        f"/api/v1/versions/{version.pk}/reject/",
        {"comment": "rank too small for this task"},
        HTTP_X_REQUEST_ID="req-123",
        REMOTE_ADDR="10.1.2.3",
    )

    assert response.status_code == 200, response.json()
    event = AuditEvent.objects.get(action="version.reject")
    assert event.actor == alex
    assert event.actor_label == "alex"
    assert event.request_id == "req-123"
    assert event.client_address == "10.1.2.3"
    assert (event.from_state, event.to_state) == ("pending_review", "rejected")
    assert event.comment == "rank too small for this task"
    assert event.department == legal
    assert event.object_id == str(version.pk)
    assert event.created_at is not None


def test_a_forged_forwarded_for_header_is_not_recorded(lena, legal, as_lena):
    as_lena.post(
        "/api/v1/adapters/",
        {"department": "legal", "name": "x", "base_model": "m"},
        format="json",
        REMOTE_ADDR="10.0.0.9",
        HTTP_X_FORWARDED_FOR="1.2.3.4",
    )
    assert AuditEvent.objects.get(action="adapter.created").client_address == "10.0.0.9"


def test_an_unsafe_request_id_is_replaced(lena, legal, as_lena):
    as_lena.post(
        "/api/v1/adapters/",
        {"department": "legal", "name": "x", "base_model": "m"},
        format="json",
        HTTP_X_REQUEST_ID="evil\nid",
    )
    request_id = AuditEvent.objects.get(action="adapter.created").request_id
    assert request_id and "\n" not in request_id


def test_membership_changes_through_the_api_are_audited(root, fred, legal, as_root):
    url = "/api/v1/departments/legal/memberships/"

    added = as_root.post(url, {"username": "fred", "role": "member"}, format="json")
    changed = as_root.post(url, {"username": "fred", "role": "approver"}, format="json")
    same = as_root.post(url, {"username": "fred", "role": "approver"}, format="json")
    removed = as_root.delete(f"{url}fred/")

    assert [r.status_code for r in (added, changed, same, removed)] == [200, 200, 200, 204]
    events = list(
        AuditEvent.objects.filter(action__startswith="membership.")
        .order_by("id")
        .values_list("action", "from_state", "to_state", "actor_label", "department__slug")
    )
    assert events == [
        ("membership.added", "", "member", "root", "legal"),
        ("membership.changed", "member", "approver", "root", "legal"),
        ("membership.removed", "approver", "", "root", "legal"),
    ]
    assert all(
        e.details == {"user": "fred"} for e in AuditEvent.objects.filter(action__startswith="m")
    )


def test_filter_by_action_and_department(lena, fred, legal, finance, as_root):
    audit_record(actor=actor(lena), action="x.one", obj=legal, department=legal)
    audit_record(actor=actor(lena), action="x.two", obj=legal, department=legal)
    audit_record(actor=actor(fred), action="x.one", obj=finance, department=finance)

    def actions(**params):
        rows = as_root.get(EVENTS, params).json()["results"]
        return sorted((e["action"], e["department"]) for e in rows)

    assert actions(action="x.one") == [("x.one", "finance"), ("x.one", "legal")]
    assert actions(action="x.one", department="legal") == [("x.one", "legal")]
    assert actions(action_prefix="x.", department="legal") == [
        ("x.one", "legal"),
        ("x.two", "legal"),
    ]
    assert actions(action="x.one", department="hr") == []


def test_outsiders_do_not_see_other_departments_events(lena, fred, legal, finance, as_fred):
    legal_event = audit_record(actor=actor(lena), action="x.legal", obj=legal, department=legal)
    audit_record(actor=actor(fred), action="x.finance", obj=finance, department=finance)

    seen = {e["action"] for e in as_fred.get(EVENTS).json()["results"]}
    assert seen == {"x.finance"}
    assert as_fred.get(EVENTS, {"department": "legal"}).json()["results"] == []
    assert as_fred.get(f"{EVENTS}{legal_event.pk}/").status_code == 404


def test_audit_events_api_is_read_only(event, as_root):
    assert as_root.post(EVENTS, {"action": "forged"}).status_code == 405
    assert as_root.patch(f"{EVENTS}{event.pk}/", {"comment": "x"}).status_code == 405
    assert as_root.delete(f"{EVENTS}{event.pk}/").status_code == 405
