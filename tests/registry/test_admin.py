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


# --- every change made in the admin goes through the services and is audited --------


def audited(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action))


def test_adding_and_renaming_a_department_in_the_admin_is_audited(as_root):
    inline = {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    added = as_root.post(
        "/admin/core/department/add/", {"slug": "hr", "name": "HR", **inline}, follow=True
    )
    assert added.status_code == 200
    department = Department.objects.get(slug="hr")
    [created] = audited("department.created")
    assert created.object_id == str(department.pk) and created.actor_label == "root"

    as_root.post(
        f"/admin/core/department/{department.pk}/change/",
        {
            "name": "Human resources",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
        follow=True,
    )
    department.refresh_from_db()
    assert department.name == "Human resources"
    [renamed] = audited("department.updated")
    assert renamed.details == {"name": ["HR", "Human resources"]}


def test_memberships_added_changed_and_removed_in_the_admin_are_audited(legal, lena, as_root):
    from django.contrib.auth import get_user_model

    newcomer = get_user_model().objects.create_user("nina", password="x")
    as_root.post(
        "/admin/core/membership/add/",
        {"user": newcomer.pk, "department": legal.pk, "role": "member"},
        follow=True,
    )
    membership = Membership.objects.get(user=newcomer)
    assert [e.details["user"] for e in audited("membership.added")] == ["nina"]

    as_root.post(
        f"/admin/core/membership/{membership.pk}/change/", {"role": "approver"}, follow=True
    )
    assert Membership.objects.get(pk=membership.pk).role == "approver"
    assert len(audited("membership.changed")) == 1

    as_root.post(
        "/admin/core/membership/",
        {"action": "delete_selected", "_selected_action": [membership.pk], "post": "yes"},
        follow=True,
    )
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert [e.details["user"] for e in audited("membership.removed")] == ["nina"]


def test_an_adapter_edited_in_the_admin_is_audited(contracts, as_root, lena):
    response = as_root.post(
        f"/admin/registry/adapter/{contracts.pk}/change/",
        {"description": "Contract review", "owners": [lena.pk]},
        follow=True,
    )
    assert response.status_code == 200
    contracts.refresh_from_db()
    assert contracts.description == "Contract review"
    assert list(contracts.owners.all()) == [lena]
    [event] = audited("adapter.updated")
    assert event.actor_label == "root"


def test_a_refusal_by_the_service_is_shown_and_nothing_is_written(legal, as_root):
    response = as_root.post(
        "/admin/registry/artifactsource/add/",
        {"department": legal.pk, "uri_prefix": "s3://bucket/../x/"},
        follow=True,
    )
    assert "path segment" in " ".join(messages_of(response))
    from registry.models import ArtifactSource

    assert not ArtifactSource.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="artifact_source").exists()


def test_artifact_sources_are_managed_in_the_admin_through_the_service(legal, as_root):
    from registry.models import ArtifactSource

    as_root.post(
        "/admin/registry/artifactsource/add/",
        {
            "department": legal.pk,
            "uri_prefix": "s3://training-out/legal",
            "access_key_id": "AKIA1",
            "secret_access_key": "admin-secret",
        },
        follow=True,
    )
    source = ArtifactSource.objects.get()
    assert source.uri_prefix == "s3://training-out/legal/"
    assert source.secret_access_key == "admin-secret"
    page = as_root.get(f"/admin/registry/artifactsource/{source.pk}/change/")
    assert b"admin-secret" not in page.content
    assert len(audited("artifact_source.created")) == 1


def test_deployments_stay_read_only_in_the_admin(root):
    from serving.models import Deployment

    request = RequestFactory().get("/admin/")
    request.user = root
    model_admin = site._registry[Deployment]
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)


def test_deleting_a_deployment_in_the_admin_goes_through_the_service(as_root, root, tmp_path):
    from serving.models import Deployment
    from tests.serving.conftest import make_deployment

    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    as_root.post(
        "/admin/serving/deployment/",
        {"action": "delete_through_service", "_selected_action": [deployment.pk]},
        follow=True,
    )
    assert not Deployment.objects.exists()
    assert len(audited("deployment.deleted")) == 1
