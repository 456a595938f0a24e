"""Admin approval screens go through the same service rules as the API:
four-eyes, a comment to reject, an audit event; and nothing is edited by hand."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.contrib.messages import get_messages
from django.test import RequestFactory

from core.models import AuditEvent, Department, Membership, Role
from registry.models import AdapterVersion
from registry.services.versions import version_transition
from tests.conftest import actor, client_for
from tests.factories import make_adapter, make_version
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/registry/adapterversion/"


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal)


def pending(author, adapter, seed):
    version = make_version(author, adapter, AdapterSpec(seed=seed))
    return version_transition(actor=actor(author), version=version, action="submit")


def review(client, version, action, comment=""):
    """The two steps of the admin action: pick, then confirm with a comment."""
    picked = client.post(
        CHANGELIST, {"action": f"{action}_selected", "_selected_action": [version.pk]}
    )
    assert picked.status_code == 200
    assert f"{action}_selected".encode() in picked.content
    return client.post(
        CHANGELIST,
        {
            "action": f"{action}_selected",
            "_selected_action": [version.pk],
            "apply": "1",
            "comment": comment,
        },
        follow=True,
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_pending_review_filter_and_per_department(lena, fred, finance, contracts, as_root):
    waiting = pending(lena, contracts, 1)
    make_version(lena, contracts, AdapterSpec(seed=2))  # registered, not submitted
    budget = make_adapter(fred, finance, name="budget")
    other = pending(fred, budget, 3)

    all_pending = as_root.get(CHANGELIST, {"review": "pending"})
    legal_pending = as_root.get(
        CHANGELIST, {"review": "pending", "adapter__department__id__exact": contracts.department_id}
    )

    assert all_pending.status_code == 200
    assert {v.pk for v in all_pending.context["cl"].result_list} == {waiting.pk, other.pk}
    assert [v.pk for v in legal_pending.context["cl"].result_list] == [waiting.pk]
    assert b"Pending review" in all_pending.content


def test_admin_approve_goes_through_the_service(lena, contracts, as_root):
    version = pending(lena, contracts, 1)

    response = review(as_root, version, "approve", comment="looks good")

    assert response.status_code == 200
    assert any("Approved 1 version" in m for m in messages_of(response))
    version.refresh_from_db()
    assert version.status == "approved"
    assert version.reviewed_by.username == "root"
    event = AuditEvent.objects.get(action="version.approve")
    assert (event.actor_label, event.from_state, event.to_state) == (
        "root",
        "pending_review",
        "approved",
    )
    assert event.comment == "looks good"
    assert event.request_id not in ("", "-")


def test_four_eyes_refuses_an_admin_who_registered_the_version(root, contracts, as_root):
    version = pending(root, contracts, 1)

    response = review(as_root, version, "approve")

    assert any("Four-eyes" in m for m in messages_of(response))
    version.refresh_from_db()
    assert version.status == "pending_review"
    assert not AuditEvent.objects.filter(action="version.approve").exists()


def test_four_eyes_refuses_a_staff_approver_who_submitted(lena, legal, contracts):
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user("sam", is_staff=True, is_superuser=True)
    Membership.objects.create(user=staff, department=legal, role=Role.APPROVER)
    version = make_version(lena, contracts)
    version_transition(actor=actor(staff), version=version, action="submit")

    response = review(client_for(staff), version, "approve")

    assert any("Four-eyes" in m for m in messages_of(response))
    version.refresh_from_db()
    assert version.status == "pending_review"


def test_reject_without_a_comment_is_refused(lena, contracts, as_root):
    version = pending(lena, contracts, 1)

    response = review(as_root, version, "reject", comment="  ")

    assert any("comment is required" in m for m in messages_of(response))
    version.refresh_from_db()
    assert version.status == "pending_review"
    assert not AuditEvent.objects.filter(action="version.reject").exists()


def test_reject_with_a_comment_is_audited(lena, contracts, as_root):
    version = pending(lena, contracts, 1)

    review(as_root, version, "reject", comment="wrong base model")

    version.refresh_from_db()
    assert (version.status, version.review_comment) == ("rejected", "wrong base model")
    assert AuditEvent.objects.get(action="version.reject").comment == "wrong base model"


def test_one_bad_version_does_not_stop_the_others(lena, root, contracts, as_root):
    mine = pending(root, contracts, 1)
    theirs = pending(lena, contracts, 2)

    response = as_root.post(
        CHANGELIST,
        {"action": "approve_selected", "_selected_action": [mine.pk, theirs.pk], "apply": "1"},
        follow=True,
    )

    statuses = dict(AdapterVersion.objects.values_list("pk", "status"))
    assert statuses == {mine.pk: "pending_review", theirs.pk: "approved"}
    text = " ".join(messages_of(response))
    assert "Four-eyes" in text and "Approved 1 version" in text


def test_versions_and_audit_events_cannot_be_edited_in_the_admin(lena, contracts, root):
    version = make_version(lena, contracts)
    request = RequestFactory().get("/admin/")
    request.user = root
    for model, obj in ((AdapterVersion, version), (AuditEvent, AuditEvent.objects.first())):
        model_admin = site._registry[model]
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request, obj)
        assert not model_admin.has_delete_permission(request, obj)
    assert "delete_selected" not in site._registry[AuditEvent].get_actions(request)
    assert "delete_selected" not in site._registry[AdapterVersion].get_actions(request)


def test_audit_event_change_page_is_view_only(lena, contracts, as_root):
    make_version(lena, contracts)
    event = AuditEvent.objects.get(action="version.registered")

    page = as_root.get(f"/admin/core/auditevent/{event.pk}/change/")

    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert b"deletelink" not in page.content


def test_people_who_are_not_staff_cannot_open_the_admin(as_alex):
    response = as_alex.get(CHANGELIST)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_department_admin_shows_memberships_read_only(legal, lena, as_root):
    page = as_root.get(f"/admin/core/department/{legal.pk}/change/")
    assert page.status_code == 200
    assert b"lena" in page.content
    assert Department.objects.count() == 1
