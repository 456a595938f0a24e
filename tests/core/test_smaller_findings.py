"""Issue 21, item 7: sign-in throttling behind proxies, the idle session
timeout, and the read ability for the audit log and memberships."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from core.models import AuditEvent
from core.services.tokens import token_create
from tests.conftest import PASSWORD, actor

pytestmark = pytest.mark.django_db

TOKEN_FORM = {
    "name": "ci",
    "department": "legal",
    "abilities": ["versions:register"],
    "expires_in_days": 30,
}
INGRESS = "10.0.0.2"  # what REMOTE_ADDR is for every request behind the ingress


def behind_ingress(client_address: str, forged: str = "") -> Client:
    # The ingress appends the address it saw; a client may have sent anything before it.
    forwarded = f"{forged}, {client_address}" if forged else client_address
    return Client(REMOTE_ADDR=INGRESS, HTTP_X_FORWARDED_FOR=forwarded)


@pytest.fixture
def one_proxy(settings):
    settings.TRUSTED_PROXY_COUNT = 1
    settings.AXES_FAILURE_LIMIT = 3


def test_behind_the_ingress_one_clients_failures_lock_only_that_client(one_proxy, lena, alex):
    attacker = behind_ingress("203.0.113.7")
    for name in ("nobody", "someone", "anyone"):
        attacker.post("/login/", {"username": name, "password": "nope"})
    assert attacker.post("/login/", {"username": "alex", "password": PASSWORD}).status_code == 429

    colleague = behind_ingress("198.51.100.20")
    assert colleague.post("/login/", {"username": "alex", "password": PASSWORD}).status_code == 302


def test_a_forged_forwarded_address_does_not_dodge_the_lockout(one_proxy, lena):
    for n in range(3):
        # A new "client" each time on the left; the ingress's entry on the right is the same.
        behind_ingress("203.0.113.7", forged=f"192.0.2.{n}").post(
            "/login/", {"username": f"nobody{n}", "password": "nope"}
        )
    again = behind_ingress("203.0.113.7", forged="192.0.2.99")
    assert again.post("/login/", {"username": "lena", "password": PASSWORD}).status_code == 429


def test_the_audit_log_records_the_client_behind_the_proxy(one_proxy, lena):
    browser = behind_ingress("203.0.113.7", forged="192.0.2.1")
    browser.force_login(lena)
    browser.post("/tokens/", TOKEN_FORM)
    event = AuditEvent.objects.get(action="token.created")
    assert event.client_address == "203.0.113.7"


def test_without_trusted_proxies_the_forwarded_header_is_ignored(settings, lena):
    settings.TRUSTED_PROXY_COUNT = 0
    browser = behind_ingress("203.0.113.7")
    browser.force_login(lena)
    browser.post("/tokens/", TOKEN_FORM)
    assert AuditEvent.objects.get(action="token.created").client_address == INGRESS


# --- idle sessions ------------------------------------------------------------------


def test_an_idle_session_is_ended(settings, lena, monkeypatch):
    settings.SESSION_IDLE_TIMEOUT_SECONDS = 600
    browser = Client()
    browser.force_login(lena)
    assert browser.get("/").status_code == 200
    started = time.time()

    monkeypatch.setattr(time, "time", lambda: started + 300)
    assert browser.get("/").status_code == 200  # used within the limit: still signed in

    monkeypatch.setattr(time, "time", lambda: started + 300 + 601)
    response = browser.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert browser.get("/api/v1/adapters/").status_code in (401, 403)


# --- the read ability ---------------------------------------------------------------


def bearer(secret):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_token_without_the_read_ability_reads_neither_audit_nor_memberships(lena, legal):
    _token, secret = token_create(
        actor=actor(lena), department=legal, name="ci", abilities=["versions:register"]
    )
    client = bearer(secret)
    for url in ("/api/v1/audit-events/", "/api/v1/departments/legal/memberships/"):
        response = client.get(url)
        assert response.status_code == 403, url
        assert response.json()["error"]["code"] == "missing_ability"


def test_a_token_with_the_read_ability_reads_both(lena, legal):
    _token, secret = token_create(
        actor=actor(lena), department=legal, name="auditor", abilities=["audit:read"]
    )
    client = bearer(secret)
    assert client.get("/api/v1/audit-events/").json()["count"] >= 1  # its own token.created
    members = client.get("/api/v1/departments/legal/memberships/").json()["results"]
    assert [m["username"] for m in members] == ["lena"]
