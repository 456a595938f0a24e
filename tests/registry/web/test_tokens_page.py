import pytest

from core.models import ApiToken, AuditEvent
from core.services.tokens import hash_token_secret

pytestmark = pytest.mark.django_db


def create(client, **overrides):
    data = {
        "name": "nightly",
        "department": "legal",
        "abilities": ["versions:register", "versions:submit"],
        "expires_in_days": 30,
        **overrides,
    }
    return client.post("/tokens/", data)


def test_a_new_tokens_secret_is_shown_once(web_lena, lena):
    response = create(web_lena)
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get()
    page = response.content.decode()
    secret = page.split('data-testid="token-secret">')[1].split("<")[0]
    assert hash_token_secret(secret) == token.secret_sha256
    assert "shown only this once" in page

    later = web_lena.get("/tokens/").content.decode()
    assert secret not in later
    assert f"{token.prefix}…" in later


def test_it_explains_a_bad_token_form(web_lena):
    response = create(web_lena, abilities=[], name="")
    assert response.status_code == 400
    page = response.content.decode()
    assert "Pick at least one ability." in page
    assert "This field is required." in page
    assert not ApiToken.objects.exists()


def test_the_service_limit_on_expiry_is_shown(web_lena, settings):
    response = create(web_lena, expires_in_days=settings.API_TOKEN_MAX_DAYS + 1)
    assert response.status_code == 400
    assert b"expires_in_days must be between 1 and" in response.content


def test_people_can_only_make_tokens_for_their_own_departments(web_fred, legal):
    response = create(web_fred)
    assert response.status_code == 400
    assert b"Select a valid choice" in response.content
    assert not ApiToken.objects.exists()


def test_revoking_a_token(web_lena):
    create(web_lena)
    token = ApiToken.objects.get()
    response = web_lena.post(f"/tokens/{token.pk}/revoke/")
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoked").count() == 1
    page = web_lena.get("/tokens/").content.decode()
    assert "Revoked token nightly" in page
    assert ">revoked</span>" in page

    again = web_lena.post(f"/tokens/{token.pk}/revoke/", follow=True)
    assert b"already revoked" in again.content


def test_nobody_revokes_someone_elses_token(web_lena, web_alex):
    create(web_lena)
    token = ApiToken.objects.get()
    assert web_alex.post(f"/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert web_lena.get(f"/tokens/{token.pk}/revoke/").status_code == 405
