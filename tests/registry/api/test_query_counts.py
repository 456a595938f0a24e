"""Every list endpoint runs the same number of SQL queries for 3 rows as for 40."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent, Department, Membership, Role
from core.services.tokens import token_create
from tests.conftest import actor, client_for
from tests.factories import make_adapter, make_version
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


def queries_for(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, {"page_size": 100})
    assert response.status_code == 200, response.json()
    return len(captured)


def assert_constant(client, url, add_rows, listed):
    add_rows(0, 3)
    # A token's first use writes last_used_at once; count after it.
    client.get(url)
    few = queries_for(client, url)
    assert listed(client.get(url, {"page_size": 100}).json()) == 3
    add_rows(3, 40)
    many = queries_for(client, url)
    assert listed(client.get(url, {"page_size": 100}).json()) == 40
    assert few == many


def count(body) -> int:
    return body["count"]


@pytest.mark.parametrize("who", ["lena", "root", "token"])
def test_versions_list(who, request, lena, legal, legal_token):
    adapter = make_adapter(lena, legal)
    user = request.getfixturevalue(who) if who != "token" else "token"

    def add(start, stop):
        for i in range(start, stop):
            version = make_version(lena, adapter, AdapterSpec(seed=5000 + i, layers=1))
            if i % 2:
                from registry.services.versions import version_transition

                version_transition(actor=actor(lena), version=version, action="submit")

    assert_constant(client_for(user, legal_token), "/api/v1/versions/", add, count)


def test_versions_of_one_adapter(lena, legal, as_lena):
    adapter = make_adapter(lena, legal)

    def add(start, stop):
        for i in range(start, stop):
            make_version(lena, adapter, AdapterSpec(seed=6000 + i, layers=1))

    assert_constant(as_lena, f"/api/v1/adapters/{adapter.pk}/versions/", add, count)


def test_adapters_list_with_owners(lena, alex, paula, legal, as_lena):
    def add(start, stop):
        for i in range(start, stop):
            make_adapter(lena, legal, name=f"adapter-{i}", owners=["lena", "alex", "paula"])

    assert_constant(as_lena, "/api/v1/adapters/", add, count)


def test_audit_events_list(lena, legal, as_lena):
    def add(start, stop):
        for i in range(start, stop):
            AuditEvent.objects.create(
                actor=lena,
                actor_label="lena",
                action="test.event",
                department=legal,
                object_type="registry.department",
                object_id=str(i),
                object_repr=f"event {i}",
            )

    assert_constant(as_lena, "/api/v1/audit-events/?action=test.event", add, count)


def test_tokens_list(lena, legal, as_lena):
    def add(start, stop):
        for i in range(start, stop):
            token_create(
                actor=actor(lena), department=legal, name=f"t{i}", abilities=["versions:register"]
            )

    assert_constant(as_lena, "/api/v1/tokens/", add, count)


@pytest.mark.parametrize("who", ["lena", "root"])
def test_departments_list(who, request, lena, root):
    def add(start, stop):
        for i in range(start, stop):
            department = Department.objects.create(slug=f"d{i}", name=f"D {i}")
            Membership.objects.create(user=lena, department=department, role=Role.MEMBER)

    user = request.getfixturevalue(who)
    # lena is also in Legal (from her fixture): count only the new departments.
    assert_constant(
        client_for(user),
        "/api/v1/departments/?ordering=slug",
        add,
        lambda body: len([d for d in body["results"] if d["slug"].startswith("d")]),
    )


def test_memberships_of_a_department(lena, legal, as_root):
    from django.contrib.auth import get_user_model

    def add(start, stop):
        for i in range(start, stop):
            user = get_user_model().objects.create_user(username=f"member{i}")
            Membership.objects.create(user=user, department=legal, role=Role.MEMBER)

    assert_constant(
        as_root,
        "/api/v1/departments/legal/memberships/",
        add,
        lambda body: len([m for m in body["results"] if m["username"].startswith("member")]),
    )
