"""Departments and memberships: who sees which, creation by platform admins,
membership rules, ordering. The status of every caller is in the authorization matrix."""

from __future__ import annotations

import pytest

from core.models import AuditEvent, Department, Membership

pytestmark = pytest.mark.django_db

DEPARTMENTS = "/api/v1/departments/"


def slugs(client, **params):
    response = client.get(DEPARTMENTS, params)
    assert response.status_code == 200, response.json()
    return [d["slug"] for d in response.json()["results"]]


def test_people_see_only_their_departments(lena, fred, as_lena, as_fred, as_root):
    Department.objects.create(slug="hr", name="HR")

    assert slugs(as_lena) == ["legal"]
    assert slugs(as_fred) == ["finance"]
    assert slugs(as_root) == ["finance", "hr", "legal"]


def test_a_token_sees_its_department_only(finance, as_token):
    assert slugs(as_token) == ["legal"]
    assert as_token.get(f"{DEPARTMENTS}finance/").status_code == 404


def test_other_departments_are_404_not_403(fred, as_lena):
    response = as_lena.get(f"{DEPARTMENTS}finance/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert as_lena.get(f"{DEPARTMENTS}no-such/").status_code == 404


def test_ordering(root, as_root):
    Department.objects.create(slug="hr", name="Zeta people")
    Department.objects.create(slug="support", name="Alpha support")

    assert slugs(as_root, ordering="-slug") == ["support", "hr"]
    assert slugs(as_root, ordering="name") == ["support", "hr"]


def test_admin_creates_a_department_with_an_audit_event(as_root):
    response = as_root.post(DEPARTMENTS, {"slug": "hr", "name": "HR"}, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["slug"] == "hr"
    event = AuditEvent.objects.get(action="department.created")
    assert (event.actor_label, event.department.slug) == ("root", "hr")


@pytest.mark.parametrize(
    "payload",
    [{"slug": "Bad Slug", "name": "x"}, {"slug": "x"}],
    ids=["bad_slug", "missing_name"],
)
def test_bad_department_input_is_400(legal, as_root, payload):
    response = as_root.post(DEPARTMENTS, payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert Department.objects.count() == 1


def test_a_taken_slug_is_a_conflict(legal, as_root):
    # Documented as 409 (a duplicate), like a taken adapter name.
    response = as_root.post(DEPARTMENTS, {"slug": "legal", "name": "Again"}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "duplicate_slug"
    assert Department.objects.count() == 1


def test_members_are_listed_with_roles(lena, alex, paula, as_lena):
    response = as_lena.get(f"{DEPARTMENTS}legal/memberships/")

    assert response.status_code == 200
    assert {(m["username"], m["role"]) for m in response.json()["results"]} == {
        ("lena", "member"),
        ("alex", "approver"),
        ("paula", "approver"),
    }


def test_membership_rules(root, fred, legal, as_root):
    url = f"{DEPARTMENTS}legal/memberships/"

    bad_role = as_root.post(url, {"username": "fred", "role": "owner"}, format="json")
    unknown = as_root.post(url, {"username": "ghost", "role": "member"}, format="json")
    added = as_root.post(url, {"username": "fred", "role": "approver"}, format="json")

    assert bad_role.status_code == 400
    assert unknown.status_code == 404
    assert "ghost" in unknown.json()["error"]["message"]
    assert added.status_code == 200
    assert added.json() | {"id": 0, "created_at": ""} == {
        "id": 0,
        "username": "fred",
        "department": "legal",
        "role": "approver",
        "created_at": "",
    }
    assert Membership.objects.get(user=fred, department=legal).role == "approver"


def test_removing_someone_who_is_not_a_member_is_404(fred, legal, as_root):
    response = as_root.delete(f"{DEPARTMENTS}legal/memberships/fred/")
    assert response.status_code == 404


def test_removing_a_member_ends_their_access(lena, legal, as_root, as_lena):
    assert as_lena.get(f"{DEPARTMENTS}legal/").status_code == 200

    assert as_root.delete(f"{DEPARTMENTS}legal/memberships/lena/").status_code == 204

    assert as_lena.get(f"{DEPARTMENTS}legal/").status_code == 404
    assert slugs(as_lena) == []
