"""Who may call what, on the pages: your keys and a department's (the secret
shown once, never cached), grants asked from a department's page and decided
on the adapter's page (four eyes), the open-door warning on a deployment's
page. Outsiders get the 404 page; every form needs its CSRF token."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from serving.models import AdapterGrant, GrantStatus, InferenceKey, ServedAdapter
from serving.services.deployments import deployment_update
from serving.services.grants import grant_request
from serving.services.inference_keys import hash_inference_key
from tests.conftest import actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def staging(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")


def _secret(page: str) -> str:
    found = re.search(r'data-testid="key-secret">([^<]+)<', page)
    assert found, "no secret on the page"
    return found.group(1)


def test_a_deployment_page_warns_while_its_front_door_is_open(staging, root, web_lena):
    page = web_lena.get(f"/deployments/{staging.name}/").content.decode()
    assert 'data-testid="open-door"' not in page
    assert "an inference key for every request" in page

    deployment_update(actor=actor(root), deployment=staging, open_door=True)

    page = web_lena.get(f"/deployments/{staging.name}/").content.decode()
    assert 'data-testid="open-door"' in page
    assert "open: no key needed" in page


def test_a_person_issues_their_own_key_and_sees_it_once(web_lena, lena, legal):
    response = web_lena.post(
        "/keys/",
        {
            "issue": "1",
            "name": "notebook",
            "department": "legal",
            "holder": "person",
            "expires_in_days": "30",
        },
    )

    assert response.status_code == 201, response.content[:2000]
    assert response["Cache-Control"] == "no-store"
    secret = _secret(response.content.decode())
    key = InferenceKey.objects.get()
    assert (key.person, key.department, key.secret_sha256) == (
        lena,
        legal,
        hash_inference_key(secret),
    )
    again = web_lena.get("/keys/").content.decode()
    assert secret not in again and key.prefix in again


def test_a_member_may_not_issue_the_departments_key_from_its_page(web_lena):
    page = web_lena.get("/departments/legal/keys/")
    assert page.status_code == 200
    assert 'value="department"' not in page.content.decode()

    response = web_lena.post(
        "/departments/legal/keys/",
        {
            "issue": "1",
            "name": "x",
            "department": "legal",
            "holder": "department",
            "expires_in_days": "30",
        },
    )

    assert response.status_code == 400
    assert not InferenceKey.objects.exists()


def test_an_approver_issues_and_revokes_a_department_key(web_alex, alex):
    response = web_alex.post(
        "/departments/legal/keys/",
        {
            "issue": "1",
            "name": "frontend",
            "department": "legal",
            "holder": "department",
            "expires_in_days": "400",
        },
    )
    assert response.status_code == 400  # past SERVING_INFERENCE_KEY_MAX_DAYS
    assert not InferenceKey.objects.exists()

    response = web_alex.post(
        "/departments/legal/keys/",
        {
            "issue": "1",
            "name": "frontend",
            "department": "legal",
            "holder": "department",
            "expires_in_days": "30",
        },
    )
    assert response.status_code == 201
    key = InferenceKey.objects.get()
    assert key.holder_kind == "department"

    revoked = web_alex.post(f"/keys/{key.pk}/revoke/", {"next": "/departments/legal/keys/"})
    assert revoked.status_code == 302 and revoked["Location"] == "/departments/legal/keys/"
    key.refresh_from_db()
    assert key.revoked_by == alex


def test_outsiders_get_the_404_page(web_fred, alex, legal):
    from serving.services.inference_keys import inference_key_issue

    key, _ = inference_key_issue(actor=actor(alex), department=legal, name="k", expires_in_days=3)

    assert web_fred.get("/departments/legal/keys/").status_code == 404
    assert web_fred.post(f"/keys/{key.pk}/revoke/").status_code == 404
    assert InferenceKey.objects.get().revoked_at is None


def test_revoking_needs_the_csrf_token(alex, legal):
    from serving.services.inference_keys import inference_key_issue

    key, _ = inference_key_issue(actor=actor(alex), department=legal, name="k", expires_in_days=3)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alex)

    assert client.post(f"/keys/{key.pk}/revoke/").status_code == 403
    assert InferenceKey.objects.get().revoked_at is None


def test_a_grant_asked_on_one_page_is_approved_on_the_adapters_page(
    web_fred, web_alex, web_lena, contracts, approved_v1, staging, fred, alex
):
    ServedAdapter.objects.create(deployment=staging, adapter=contracts, version=approved_v1)
    asked = web_fred.post(
        "/departments/finance/keys/",
        {
            "ask": "1",
            "served_name": contracts.served_name,
            "reason": "invoice checks",
            "expires_in_days": "30",
        },
    )
    assert asked.status_code == 302, asked.content[:2000]
    grant = AdapterGrant.objects.get()
    assert (grant.department.slug, grant.requested_by, grant.status) == (
        "finance",
        fred,
        GrantStatus.REQUESTED,
    )

    adapter_page = f"/adapters/{contracts.pk}/"
    page = web_alex.get(adapter_page).content.decode()
    assert 'data-testid="adapter-access"' in page
    assert f'data-testid="grant-{grant.pk}"' in page and 'value="approve"' in page
    assert 'value="approve"' not in web_lena.get(adapter_page).content.decode()

    decided = web_alex.post(
        f"/grants/{grant.pk}/decide/", {"decision": "approve", "next": adapter_page}
    )
    assert decided.status_code == 302
    page = web_alex.get(adapter_page).content.decode()
    assert f"grant #{grant.pk} by alex until" in page
    assert "finance" in page

    finance_page = web_fred.get("/departments/finance/keys/").content.decode()
    assert contracts.served_name in finance_page and "Approved" in finance_page


def test_a_name_nobody_serves_is_asked_as_a_served_one_is(web_fred, contracts):
    def ask(name):
        body = {"ask": "1", "served_name": name, "reason": "x", "expires_in_days": "3"}
        return web_fred.post("/departments/finance/keys/", body, follow=True)

    served, unknown = ask(contracts.served_name), ask("nothing-here")

    assert [r[1] for r in served.redirect_chain] == [r[1] for r in unknown.redirect_chain] == [302]
    said = [[str(m) for m in r.context["messages"]] for r in (served, unknown)]
    first, second = AdapterGrant.objects.order_by("pk")
    assert said == [
        [
            f"Asked for grant #{first.pk}: Finance to call {contracts.served_name}. "
            "An approver of the adapter's department decides."
        ],
        [
            f"Asked for grant #{second.pk}: Finance to call nothing-here. "
            "An approver of the adapter's department decides."
        ],
    ]
    page = unknown.content.decode()
    # Both rows read alike: no department is named before one answers.
    assert f'data-testid="grant-{second.pk}"' in page and "nothing-here" in page
    assert "(Legal)" not in page


def test_a_name_that_cannot_be_served_is_an_error_on_the_form(web_fred):
    response = web_fred.post(
        "/departments/finance/keys/",
        {"ask": "1", "served_name": "no spaces!", "reason": "x", "expires_in_days": "3"},
    )

    assert response.status_code == 400
    assert "is not a served name" in response.content.decode()
    assert not AdapterGrant.objects.exists()


def test_the_requester_sees_the_four_eyes_rule_instead_of_the_buttons(
    web_alex, alex, finance, contracts
):
    from core.models import Membership, Role

    Membership.objects.create(user=alex, department=finance, role=Role.MEMBER)
    grant = grant_request(
        actor=actor(alex),
        department=finance,
        served_name=contracts.served_name,
        expires_in_days=3,
        reason="x",
    )

    page = web_alex.get(f"/adapters/{contracts.pk}/").content.decode()

    assert "Four-eyes rule" in page
    refused = web_alex.post(f"/grants/{grant.pk}/decide/", {"decision": "approve"})
    assert refused.status_code == 302
    assert AdapterGrant.objects.get().status == GrantStatus.REQUESTED
