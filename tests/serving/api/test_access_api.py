"""The keys and grants API (serving/api/callers.py): the secret in the creating
answer only, statuses, bad input as a 4xx naming the problem with nothing
written, and who may call an adapter and why. Who gets which status is
test_access_authorization_matrix.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import Membership, Role
from core.services.service_accounts import service_account_create
from serving.models import InferenceKey, ServedAdapter
from serving.services.inference_keys import hash_inference_key
from tests.conftest import actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


def _create(client, **body):
    return client.post(
        "/api/v1/inference-keys/",
        {"department": "legal", "name": "frontend", "expires_in_days": 30, **body},
        format="json",
    )


def test_the_secret_is_in_the_creating_answer_only(as_alex):
    created = _create(as_alex)
    assert created.status_code == 201, created.content
    body = created.json()
    secret = body["secret"]
    assert secret.startswith("lsk_") and body["prefix"] == secret[:12]
    assert (body["holder"], body["status"], body["department"]) == ("department", "active", "legal")
    assert InferenceKey.objects.get(pk=body["id"]).secret_sha256 == hash_inference_key(secret)

    listed = as_alex.get("/api/v1/inference-keys/").json()["results"]
    shown = as_alex.get(f"/api/v1/inference-keys/{body['id']}/").json()
    assert [row["prefix"] for row in listed] == [body["prefix"]]
    for answer in (listed[0], shown):
        assert "secret" not in answer
        assert secret[12:] not in str(answer)


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({"expires_in_days": None}, 400, "expires_in_days"),
        ({"expires_in_days": 366}, 400, "expires_in_days"),
        ({"expires_in_days": 0}, 400, "expires_in_days"),
        ({"name": ""}, 400, "name"),
        ({"holder": "anyone"}, 400, "holder"),
        ({"department": "nowhere"}, 404, None),
        ({"holder": "service_account", "service_account": "ghost"}, 404, None),
        ({"holder": "service_account"}, 404, None),
    ],
)
def test_bad_input_is_a_4xx_naming_the_problem_and_writes_nothing(as_alex, body, status, field):
    response = _create(as_alex, **body)

    assert response.status_code == status, response.content
    error = response.json()["error"]
    if field is not None:  # named in the field errors, or in the message
        assert field in error["details"].get("fields", {}) or field in error["message"]
    assert not InferenceKey.objects.exists()


def test_missing_expiry_is_refused(as_alex):
    response = as_alex.post(
        "/api/v1/inference-keys/", {"department": "legal", "name": "x"}, format="json"
    )
    assert response.status_code == 400
    assert "expires_in_days" in response.json()["error"]["details"]["fields"]


def test_a_service_accounts_key_names_the_account(as_alex, alex, legal):
    service_account_create(actor=actor(alex), department=legal, name="chatbot")

    body = _create(as_alex, holder="service_account", service_account="chatbot").json()

    assert (body["holder"], body["service_account"], body["person"]) == (
        "service_account",
        "chatbot",
        None,
    )


def test_the_list_filters_by_status(as_alex, as_lena, lena, legal, alex):
    active = _create(as_alex).json()
    revoked = _create(as_alex).json()
    expired = _create(as_alex).json()
    suspended = _create(as_lena, holder="person").json()
    assert as_alex.post(f"/api/v1/inference-keys/{revoked['id']}/revoke/", {}).status_code == 200
    InferenceKey.objects.filter(pk=expired["id"]).update(expires_at=timezone.now())
    Membership.objects.filter(user=lena).delete()  # lena left Legal: her key stops counting

    def ids(status):
        rows = as_alex.get(f"/api/v1/inference-keys/?status={status}").json()["results"]
        return [row["id"] for row in rows]

    assert ids("active") == [active["id"]]
    assert ids("revoked") == [revoked["id"]]
    assert ids("expired") == [expired["id"]]
    assert ids("suspended") == [suspended["id"]]
    assert as_alex.get("/api/v1/inference-keys/?status=").status_code == 400
    shown = as_alex.get(f"/api/v1/inference-keys/{suspended['id']}/").json()
    assert shown["status"] == "suspended"


def test_revoking_twice_is_a_conflict(as_alex):
    key = _create(as_alex).json()
    first = as_alex.post(f"/api/v1/inference-keys/{key['id']}/revoke/", {"reason": "leaked"})
    assert (first.status_code, first.json()["status"]) == (200, "revoked")
    assert first.json()["revoked_reason"] == "leaked"

    again = as_alex.post(f"/api/v1/inference-keys/{key['id']}/revoke/", {})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_revoked"


def _ask(client) -> dict:
    """Finance asks to call legal-contracts."""
    body = {"served_name": "legal-contracts", "department": "finance", "reason": "x"}
    response = client.post("/api/v1/grants/", {**body, "expires_in_days": 3}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.fixture
def served(root, tmp_path, contracts, approved_v1, legal):
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, version=approved_v1)
    return deployment


def test_a_grant_asked_approved_and_revoked_shows_who_may_call_and_why(
    as_fred, as_alex, contracts, served
):
    asked = as_fred.post(
        "/api/v1/grants/",
        {
            "served_name": "legal-contracts",
            "department": "finance",
            "reason": "invoice checks",
            "expires_in_days": 30,
        },
        format="json",
    )
    assert asked.status_code == 201, asked.content
    grant = asked.json()
    # Whose adapter it is, the asking side learns when that department answers.
    assert (grant["status"], grant["adapter_department"], grant["requested_by"]) == (
        "requested",
        None,
        "fred",
    )
    seen_by_alex = as_alex.get(f"/api/v1/grants/{grant['id']}/").json()
    assert seen_by_alex["adapter_department"] == "legal"

    approved = as_alex.post(f"/api/v1/grants/{grant['id']}/approve/", {}, format="json")
    assert (approved.status_code, approved.json()["status"]) == (200, "approved")
    assert as_fred.get(f"/api/v1/grants/{grant['id']}/").json()["adapter_department"] == "legal"

    callers = as_alex.get(f"/api/v1/adapters/{contracts.pk}/callers/").json()
    assert callers == [
        {
            "department": "legal",
            "why": "own",
            "grant": None,
            "approved_by": None,
            "expires_at": None,
            "deployments": ["staging-cpu"],
        },
        {
            "department": "finance",
            "why": "grant",
            "grant": grant["id"],
            "approved_by": "alex",
            "expires_at": grant["expires_at"],
            "deployments": ["staging-cpu"],
        },
    ]

    revoked = as_alex.post(f"/api/v1/grants/{grant['id']}/revoke/", {"comment": "done"})
    assert (revoked.status_code, revoked.json()["status"]) == (200, "revoked")
    callers = as_alex.get(f"/api/v1/adapters/{contracts.pk}/callers/").json()
    assert [c["department"] for c in callers] == ["legal"]


def test_a_deployment_that_does_not_take_the_department_is_not_listed_for_it(
    as_alex, contracts, served, finance
):
    served.allowed_departments.set([finance])

    callers = as_alex.get(f"/api/v1/adapters/{contracts.pk}/callers/").json()

    assert callers[0]["deployments"] == []


def test_the_four_eyes_refusal_names_the_rule(as_alex, alex, finance, contracts):
    Membership.objects.create(user=alex, department=finance, role=Role.MEMBER)
    asked = _ask(as_alex)

    response = as_alex.post(f"/api/v1/grants/{asked['id']}/approve/", {}, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "four_eyes"


def test_refusing_without_a_comment_is_a_400(as_fred, as_alex, contracts):
    asked = _ask(as_fred)

    response = as_alex.post(f"/api/v1/grants/{asked['id']}/refuse/", {}, format="json")

    assert response.status_code == 400
    assert "comment" in response.json()["error"]["details"]["fields"]


def test_grants_filter_by_adapter_department_and_status(as_fred, as_alex, contracts):
    asked = _ask(as_fred)

    def ids(query):
        return [g["id"] for g in as_alex.get(f"/api/v1/grants/?{query}").json()["results"]]

    assert ids("served_name=legal-contracts&department=finance&status=requested") == [asked["id"]]
    assert ids("status=approved") == []
    assert ids("served_name=other") == []
    assert as_alex.get("/api/v1/grants/?status=bogus").status_code == 400


def test_an_expired_grant_is_not_a_caller(as_fred, as_alex, contracts, served):
    from serving.models import AdapterGrant

    asked = _ask(as_fred)
    as_alex.post(f"/api/v1/grants/{asked['id']}/approve/", {}, format="json")
    AdapterGrant.objects.filter(pk=asked["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    callers = as_alex.get(f"/api/v1/adapters/{contracts.pk}/callers/").json()

    assert [c["department"] for c in callers] == ["legal"]


def test_a_name_nobody_serves_gets_the_answer_a_served_one_gets(as_fred, contracts, served):
    def ask(name):
        body = {"served_name": name, "department": "finance", "reason": "x", "expires_in_days": 3}
        return as_fred.post("/api/v1/grants/", body, format="json")

    served_answer, unknown_answer = ask("legal-contracts"), ask("legal-secrets")

    assert served_answer.status_code == unknown_answer.status_code == 201, unknown_answer.content
    differ = {"id", "served_name", "expires_at", "created_at"}

    def same_part(answer):
        return {k: v for k, v in answer.json().items() if k not in differ}

    assert same_part(unknown_answer) == same_part(served_answer)
    assert same_part(unknown_answer)["status"] == "requested"
    listed = as_fred.get("/api/v1/grants/?department=finance").json()["results"]
    assert sorted((g["served_name"], g["status"]) for g in listed) == [
        ("legal-contracts", "requested"),
        ("legal-secrets", "requested"),
    ]
    # Asking again is the same 409 either way.
    assert ask("legal-secrets").status_code == ask("legal-contracts").status_code == 409
