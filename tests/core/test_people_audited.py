"""Issue 21, item 6: people and groups change only with a trace. Django's own
User and Group admin wrote nothing to the audit chain: granting is_staff (a
platform admin), is_active, a password or a second account left no event."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from core.models import Ability, AuditEvent
from core.services.tokens import token_create
from tests.conftest import PASSWORD, actor

pytestmark = pytest.mark.django_db
User = get_user_model()


@pytest.fixture
def admin_browser(root):
    browser = Client()
    browser.force_login(root)
    return browser


def change_form(user, **overrides):
    data = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": "on" if user.is_active else "",
        "is_staff": "on" if user.is_staff else "",
        "is_superuser": "on" if user.is_superuser else "",
        "groups": [],
        "user_permissions": [],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v != ""}


def test_granting_platform_admin_in_the_admin_is_audited(admin_browser, lena):
    response = admin_browser.post(
        f"/admin/auth/user/{lena.pk}/change/", change_form(lena, is_staff="on")
    )
    assert response.status_code == 302, response.content[:2000]
    lena.refresh_from_db()
    assert lena.is_staff
    event = AuditEvent.objects.get(action="user.changed", object_id=str(lena.pk))
    assert event.actor.username == "root"
    assert event.details["changes"] == {"is_staff": [False, True]}


def test_deactivating_a_person_ends_their_sessions_and_tokens_at_once(admin_browser, lena, legal):
    _token, secret = token_create(
        actor=actor(lena), department=legal, name="ci", abilities=[Ability.REGISTER_VERSIONS]
    )
    browser = Client()
    browser.post("/login/", {"username": "lena", "password": PASSWORD})
    assert browser.get("/").status_code == 200

    admin_browser.post(f"/admin/auth/user/{lena.pk}/change/", change_form(lena, is_active=""))

    assert browser.get("/").status_code == 302  # the session is gone
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/v1/departments/legal/").status_code == 401
    ended = AuditEvent.objects.get(action="user.access_ended")
    assert ended.details["sessions_ended"] == 1 and len(ended.details["revoked_tokens"]) == 1
    lena.refresh_from_db()
    lena.is_active = True  # back again: the revoked token stays revoked
    lena.save()
    assert api.get("/api/v1/departments/legal/").status_code == 401


def test_a_second_account_and_its_password_are_audited(admin_browser):
    response = admin_browser.post(
        "/admin/auth/user/add/",
        {
            "username": "lena2",
            "password1": "a-long-pass-phrase-9",
            "password2": "a-long-pass-phrase-9",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    created = AuditEvent.objects.get(action="user.created")
    assert created.details["username"] == "lena2" and created.details["password_set"] is True
    assert "a-long-pass-phrase-9" not in str(created.details)

    user = User.objects.get(username="lena2")
    admin_browser.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": "another-pass-phrase-7", "password2": "another-pass-phrase-7"},
    )
    assert AuditEvent.objects.filter(action="user.password_changed", object_id=str(user.pk))


def test_group_membership_and_group_changes_are_audited(admin_browser, lena):
    response = admin_browser.post("/admin/auth/group/add/", {"name": "auditors"})
    assert response.status_code == 302, response.content[:2000]
    group = Group.objects.get(name="auditors")
    assert AuditEvent.objects.get(action="group.created").details["after"]["name"] == "auditors"

    admin_browser.post(
        f"/admin/auth/user/{lena.pk}/change/", change_form(lena, groups=[str(group.pk)])
    )
    event = AuditEvent.objects.get(action="user.groups_changed")
    assert event.details["added"] == ["auditors"]


def test_users_are_never_deleted_in_the_admin(admin_browser, lena):
    response = admin_browser.get(f"/admin/auth/user/{lena.pk}/delete/")
    assert response.status_code == 403
