"""/api/v1/webhooks/: a department's approvers add, change and remove them;
the secret is shown once; internal addresses need a platform admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.actors import Actor
from notifications.models import Webhook
from notifications.services.webhooks import webhook_create

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/hooks/registry"


def test_the_secret_is_in_the_creation_answer_only(as_alex, legal):
    created = as_alex.post(
        "/api/v1/webhooks/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    )
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("whsec_")
    assert body["kinds"] == []
    shown = as_alex.get(f"/api/v1/webhooks/{body['id']}/").json()
    assert "secret" not in shown
    assert body["secret"] not in as_alex.get("/api/v1/webhooks/").content.decode()


def test_the_secret_is_kept_encrypted(as_alex, legal):
    from django.db import connection

    body = as_alex.post(
        "/api/v1/webhooks/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    ).json()
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM notifications_webhook WHERE id = %s", [body["id"]])
        (stored,) = cursor.fetchone()
    assert body["secret"] not in stored
    assert Webhook.objects.get(pk=body["id"]).secret == body["secret"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/api/v1/",
        "http://10.0.0.7/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://localhost/hook",
    ],
)
def test_an_internal_address_is_refused_naming_the_rule(as_alex, legal, url):
    response = as_alex.post("/api/v1/webhooks/", {"department": "legal", "url": url}, format="json")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "webhook_url_not_allowed"
    assert "internal address" in error["message"]


def test_a_platform_admin_may_allow_an_internal_address(as_root, legal):
    response = as_root.post(
        "/api/v1/webhooks/",
        {"department": "legal", "url": "http://127.0.0.1:9/hook", "allow_internal": True},
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["allow_internal"] is True


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("ftp://93.184.215.14/x", "invalid"),
        ("https://user:pw@93.184.215.14/x", "bad_webhook_url"),
    ],
)
def test_a_url_that_is_not_http_or_carries_credentials_is_a_400(as_alex, legal, url, code):
    response = as_alex.post("/api/v1/webhooks/", {"department": "legal", "url": url}, format="json")
    assert response.status_code == 400, response.json()
    assert "url" in response.content.decode() or code in response.content.decode()


def test_an_unknown_event_kind_is_a_400_naming_it(as_alex, legal):
    response = as_alex.post(
        "/api/v1/webhooks/",
        {"department": "legal", "url": PUBLIC_URL, "kinds": ["version.eaten"]},
        format="json",
    )
    assert response.status_code == 400
    assert "kinds" in response.content.decode()


def test_a_disabled_webhook_is_enabled_again_with_its_failures_forgotten(as_alex, legal, root):
    webhook, _ = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    Webhook.objects.filter(pk=webhook.pk).update(
        active=False,
        consecutive_failures=30,
        failing_since=timezone.now() - timedelta(days=1),
        disabled_reason="30 failed attempts in a row over 12 hours or more",
    )
    response = as_alex.patch(f"/api/v1/webhooks/{webhook.pk}/", {"active": True}, format="json")
    assert response.status_code == 200
    assert response.json()["active"] is True
    assert response.json()["consecutive_failures"] == 0
    assert response.json()["failing_since"] is None


def test_a_member_is_not_told_a_webhook_exists(as_lena, legal, root):
    webhook, _ = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    assert as_lena.get("/api/v1/webhooks/").json()["count"] == 0
    assert as_lena.get(f"/api/v1/webhooks/{webhook.pk}/").status_code == 404
