"""Service accounts (issue 21, item 3): a department's pipelines are not people.

Approvers (and platform admins) create them and mint their tokens; the tokens
keep working when their creator leaves, can never approve, stop the moment the
account is deactivated, and every use names the account and its creator in
the audit log. A person's token still ends with the person."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from core.models import ApiToken, AuditEvent, Membership, ServiceAccount
from registry.models import AdapterVersion
from tests.conftest import PASSWORD
from tests.factories import archive_upload, make_adapter

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def create_account(client, name="nightly-train"):
    return client.post(
        "/api/v1/service-accounts/",
        {"department": "legal", "name": name, "description": "the training pipeline"},
        format="json",
    )


def mint(client, account_id, abilities=("versions:register", "versions:submit")):
    return client.post(
        f"/api/v1/service-accounts/{account_id}/tokens/",
        {"name": "ci", "abilities": list(abilities), "expires_in_days": 30},
        format="json",
    )


@pytest.fixture
def pipeline(as_alex):
    account = create_account(as_alex)
    assert account.status_code == 201, account.json()
    token = mint(as_alex, account.json()["id"])
    assert token.status_code == 201, token.json()
    return account.json(), token.json()["secret"]


def test_an_approver_creates_one_and_its_token_registers_as_the_account(
    pipeline, alex, lena, legal
):
    account, secret = pipeline
    assert account["username"] == "svc.legal.nightly-train" and account["created_by"] == "alex"
    adapter = make_adapter(lena, legal, name="contracts")

    response = bearer(secret).post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    )

    assert response.status_code == 201, response.json()
    version = AdapterVersion.objects.get(pk=response.json()["id"])
    assert version.registered_by.username == "svc.legal.nightly-train"
    event = AuditEvent.objects.get(action="version.registered")
    assert event.actor.username == "svc.legal.nightly-train"
    assert event.actor_label.startswith("service:legal/nightly-train token:lrt_")
    assert "(created by alex)" in event.actor_label
    assert event.details["service_account"] == {
        "id": account["id"],
        "name": "legal/nightly-train",
        "created_by": "alex",
        "token_created_by": "alex",
    }


def test_members_tokens_and_outsiders_cannot_create_one(as_lena, as_token, as_fred):
    assert create_account(as_lena).status_code == 403
    assert create_account(as_token).status_code == 403
    assert create_account(as_fred).status_code == 404
    assert not get_user_model().objects.filter(username__startswith="svc.").exists()


def test_members_see_their_departments_accounts_and_outsiders_do_not(pipeline, as_lena, as_fred):
    account, _ = pipeline
    assert [a["name"] for a in as_lena.get("/api/v1/service-accounts/").json()["results"]] == [
        "nightly-train"
    ]
    assert as_fred.get("/api/v1/service-accounts/").json()["results"] == []
    assert as_fred.get(f"/api/v1/service-accounts/{account['id']}/").status_code == 404
    assert mint(as_lena, account["id"]).status_code == 403


def test_it_survives_its_creators_departure_and_the_creators_own_token_does_not(
    pipeline, as_alex, alex, lena, legal
):
    _, secret = pipeline
    person = as_alex.post(
        "/api/v1/tokens/",
        {"department": "legal", "name": "mine", "abilities": ["versions:register"]},
        format="json",
    ).json()["secret"]
    adapter = make_adapter(lena, legal, name="contracts")
    url = f"/api/v1/adapters/{adapter.pk}/versions/"
    assert bearer(person).get(url).status_code == 200

    Membership.objects.filter(user=alex).delete()
    alex.is_active = False
    alex.save()

    assert bearer(person).get(url).status_code == 401
    assert bearer(secret).get(url).status_code == 200


def test_it_can_never_approve(pipeline, lena, legal):
    _, secret = pipeline
    adapter = make_adapter(lena, legal, name="contracts")
    client = bearer(secret)
    version = client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    ).json()
    assert client.post(f"/api/v1/versions/{version['id']}/submit/").status_code == 200

    response = client.post(f"/api/v1/versions/{version['id']}/approve/")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "token_forbidden"


def test_deactivating_it_ends_every_token_at_once(pipeline, as_alex, lena, legal):
    account, secret = pipeline
    second = mint(as_alex, account["id"]).json()["secret"]
    adapter = make_adapter(lena, legal, name="contracts")
    url = f"/api/v1/adapters/{adapter.pk}/versions/"

    response = as_alex.post(f"/api/v1/service-accounts/{account['id']}/deactivate/")

    assert response.status_code == 200 and response.json()["active"] is False
    assert bearer(secret).get(url).status_code == 401
    assert bearer(second).get(url).status_code == 401
    assert mint(as_alex, account["id"]).status_code == 409
    event = AuditEvent.objects.get(action="service_account.deactivated")
    assert len(event.details["revoked_tokens"]) == 2


def test_its_tokens_are_listed_to_the_departments_approvers(pipeline, as_paula):
    # paula did not mint it, but the token is the department's.
    names = [t["name"] for t in as_paula.get("/api/v1/tokens/").json()["results"]]
    assert names == ["ci"]


def test_it_cannot_sign_in(pipeline):
    user = get_user_model().objects.get(username="svc.legal.nightly-train")
    assert not user.has_usable_password()
    browser = Client()
    page = browser.post("/login/", {"username": user.username, "password": PASSWORD})
    assert "_auth_user_id" not in browser.session
    assert page.status_code == 200  # the form again, with its error


def test_a_platform_admin_creates_and_deactivates_one_in_the_admin(root, legal):
    from core.models import ServiceAccount

    browser = Client()
    browser.force_login(root)
    added = browser.post(
        "/admin/core/serviceaccount/add/",
        {"department": legal.pk, "name": "eval", "description": ""},
    )
    assert added.status_code == 302, added.content[:500]
    account = ServiceAccount.objects.get(name="eval")
    assert AuditEvent.objects.filter(action="service_account.created", object_id=account.pk)

    browser.post(
        "/admin/core/serviceaccount/",
        {"action": "deactivate", "_selected_action": [account.pk]},
    )
    account.refresh_from_db()
    assert account.deactivated_at is not None
    assert AuditEvent.objects.filter(action="service_account.deactivated").count() == 1


def test_four_eyes_holds_after_the_pipelines_rows_are_edited(
    pipeline, as_alex, as_paula, lena, legal
):
    """The people behind the work are recorded when it is done: editing the token's
    or the account's creator afterwards (or ending both) does not let alex approve."""
    account, secret = pipeline
    adapter = make_adapter(lena, legal, name="contracts")
    registered = bearer(secret).post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    )
    version_id = registered.json()["id"]
    assert bearer(secret).post(f"/api/v1/versions/{version_id}/submit/").status_code == 200
    ApiToken.objects.filter(service_account_id=account["id"]).update(created_by=lena)
    ServiceAccount.objects.filter(pk=account["id"]).update(created_by=lena)
    assert as_alex.post(f"/api/v1/service-accounts/{account['id']}/deactivate/").status_code == 200

    refused = as_alex.post(f"/api/v1/versions/{version_id}/approve/")

    assert refused.status_code == 403 and refused.json()["error"]["code"] == "four_eyes"
    assert AdapterVersion.objects.get(pk=version_id).status == "pending_review"
    assert as_paula.post(f"/api/v1/versions/{version_id}/approve/").status_code == 200
