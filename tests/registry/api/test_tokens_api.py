"""Pipeline tokens: hashed at rest, shown once, expiring, revocable, never approving,
scoped to named abilities, audited, and never logged."""

from __future__ import annotations

import hashlib
import io
import logging
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from core.models import ApiToken, AuditEvent, Membership
from core.services.tokens import token_create
from tests.conftest import actor, client_for
from tests.factories import make_adapter, make_approved_version, make_version

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"


def create(client, **overrides):
    payload = {"department": "legal", "name": "ci", "abilities": ["versions:register"]}
    payload.update(overrides)
    return client.post(TOKENS, payload, format="json")


def bearer(secret):
    return client_for("token", type("T", (), {"secret": secret}))


def test_secret_is_shown_once_and_stored_only_as_a_digest(as_lena):
    response = create(as_lena)

    assert response.status_code == 201, response.json()
    body = response.json()
    secret = body["secret"]
    assert secret.startswith("lrt_") and len(secret) > 40
    assert body["prefix"] == secret[: len(body["prefix"])]
    row = ApiToken.objects.get(pk=body["id"])
    assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()

    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert secret not in dump.getvalue()
    assert secret[len(body["prefix"]) :] not in dump.getvalue()

    listed = as_lena.get(TOKENS).json()["results"]
    retrieved = as_lena.get(f"{TOKENS}{body['id']}/").json()
    for shown in (listed[0], retrieved):
        assert "secret" not in shown
        assert secret not in str(shown)


def test_a_new_token_authenticates(as_lena, lena, legal):
    secret = create(as_lena).json()["secret"]
    response = bearer(secret).get("/api/v1/adapters/")
    assert response.status_code == 200


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(
            lambda t: ApiToken.objects.filter(pk=t.pk).update(
                expires_at=timezone.now() - timedelta(seconds=1)
            ),
            id="expired",
        ),
        pytest.param(
            lambda t: ApiToken.objects.filter(pk=t.pk).update(revoked_at=timezone.now()),
            id="revoked",
        ),
        pytest.param(
            lambda t: Membership.objects.filter(user=t.created_by).delete(),
            id="creator_left_department",
        ),
        pytest.param(
            lambda t: type(t.created_by).objects.filter(pk=t.created_by_id).update(is_active=False),
            id="creator_deactivated",
        ),
    ],
)
def test_unusable_tokens_get_401(spoil, legal_token):
    assert client_for("token", legal_token).get("/api/v1/adapters/").status_code == 200
    spoil(legal_token)

    response = client_for("token", legal_token).get("/api/v1/adapters/")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_unknown_token_gets_401_in_the_error_format(anonymous):
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer lrt_not-a-real-token")
    response = anonymous.get("/api/v1/adapters/")
    assert response.status_code == 401
    assert set(response.json()["error"]) >= {"status", "code", "message"}


def test_revoke_through_the_api_makes_the_token_401(as_lena):
    body = create(as_lena).json()
    assert bearer(body["secret"]).get("/api/v1/adapters/").status_code == 200

    response = as_lena.post(f"{TOKENS}{body['id']}/revoke/")

    assert response.status_code == 200
    assert response.json()["revoked_at"]
    assert bearer(body["secret"]).get("/api/v1/adapters/").status_code == 401
    again = as_lena.post(f"{TOKENS}{body['id']}/revoke/")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_revoked"


@pytest.mark.parametrize("action", ["approve", "reject", "deprecate", "archive"])
def test_a_token_can_never_review_or_retire(action, lena, alex, legal, as_token):
    adapter = make_adapter(lena, legal)
    if action in {"approve", "reject"}:
        version = make_version(lena, adapter)
        from registry.services.versions import version_transition

        version_transition(actor=actor(lena), version=version, action="submit")
    else:
        version = make_approved_version(lena, alex, adapter)

    response = as_token.post(f"/api/v1/versions/{version.pk}/{action}/", {"comment": "x"})

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "token_forbidden"


def test_a_token_without_the_register_ability_gets_403_naming_it(lena, legal):
    adapter = make_adapter(lena, legal)
    token, secret = token_create(
        actor=actor(lena), department=legal, name="submit-only", abilities=["versions:submit"]
    )
    from tests.factories import archive_upload

    response = bearer(secret).post(
        f"/api/v1/adapters/{adapter.pk}/versions/", {"files": [archive_upload()]}
    )

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "missing_ability"
    assert "versions:register" in error["message"]


def test_a_token_cannot_create_or_revoke_tokens(as_token, legal_token):
    created = create(as_token)
    assert created.status_code == 403
    assert created.json()["error"]["code"] == "token_forbidden"
    # Tokens see no tokens, so revoking one is a 404, not a hint that it exists.
    assert as_token.post(f"{TOKENS}{legal_token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.count() == 1


def test_outsiders_cannot_make_tokens_for_a_department(as_fred, legal):
    response = create(as_fred)
    assert response.status_code == 404


def test_unknown_ability_and_bad_expiry_are_400(as_lena, settings):
    assert create(as_lena, abilities=["versions:approve"]).status_code == 400
    response = create(as_lena, expires_in_days=settings.API_TOKEN_MAX_DAYS + 1)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_expiry"


def test_people_see_only_their_own_tokens(as_lena, as_alex, as_root, legal_token):
    create(as_alex, name="alex-ci")
    assert {t["name"] for t in as_lena.get(TOKENS).json()["results"]} == {"ci"}
    assert {t["name"] for t in as_alex.get(TOKENS).json()["results"]} == {"alex-ci"}
    assert as_alex.get(f"{TOKENS}{legal_token.pk}/").status_code == 404
    assert {t["name"] for t in as_root.get(TOKENS).json()["results"]} == {"ci", "alex-ci"}


def test_create_and_revoke_are_audited(as_lena):
    body = create(as_lena, abilities=["versions:register", "versions:submit"]).json()
    as_lena.post(f"{TOKENS}{body['id']}/revoke/", HTTP_X_REQUEST_ID="revoke-1")

    created = AuditEvent.objects.get(action="token.created", object_id=str(body["id"]))
    revoked = AuditEvent.objects.get(action="token.revoked", object_id=str(body["id"]))
    assert created.actor.username == revoked.actor.username == "lena"
    assert created.department.slug == "legal"
    assert created.details["abilities"] == ["versions:register", "versions:submit"]
    assert revoked.request_id == "revoke-1"
    assert body["secret"] not in str(created.details)


def test_the_secret_never_reaches_the_logs(as_lena, lena, legal, caplog, settings):
    # DEBUG makes Django log every SQL statement too.
    settings.DEBUG = True
    caplog.set_level(logging.DEBUG)
    adapter = make_adapter(lena, legal)

    body = create(as_lena, abilities=["versions:register", "versions:submit"]).json()
    secret = body["secret"]
    as_token = bearer(secret)
    as_token.get("/api/v1/adapters/")
    as_token.get(f"/api/v1/adapters/{adapter.pk}/versions/")
    as_token.post("/api/v1/versions/999999/submit/")
    as_lena.post(f"{TOKENS}{body['id']}/revoke/")
    assert as_token.get("/api/v1/adapters/").status_code == 401

    logged = "\n".join(r.getMessage() + " " + str(r.__dict__) for r in caplog.records)
    assert caplog.records, "nothing was logged; the check would prove nothing"
    assert secret not in logged
    assert secret[len(body["prefix"]) :] not in logged


def test_a_refused_authorization_header_is_not_logged(anonymous, caplog):
    caplog.set_level(logging.DEBUG)
    header = "Bearer lrt_this-is-a-guess-0123456789abcdef"
    anonymous.credentials(HTTP_AUTHORIZATION=header)

    assert anonymous.get("/api/v1/adapters/").status_code == 401

    logged = "\n".join(r.getMessage() + " " + str(r.__dict__) for r in caplog.records)
    assert any(r.levelno >= logging.WARNING for r in caplog.records), "the 401 was not logged"
    assert "this-is-a-guess" not in logged
