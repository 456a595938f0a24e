"""Chat channels: a department's approvers add a Slack- or Teams-compatible
incoming webhook; the department's events reach a real receiver on loopback
as {"text": ...} through the webhooks' deliveries; the URL is a secret, kept
encrypted and never shown; internal addresses and outsiders are refused."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from core.actors import Actor
from core.models import AuditEvent
from notifications.models import Delivery, DeliveryStatus, Webhook
from notifications.services.chat_channels import chat_channel_create
from notifications.services.webhooks import delivery_attempt
from notifications.signing import HEADER
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter, make_version
from tests.notifications.conftest import fan_out_all
from tests.notifications.test_webhooks import Receiver
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/services/T000/B000/very-secret-path"


@pytest.fixture
def receiver(settings):
    settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.NOTIFICATIONS_SITE_URL = "https://registry.example.com"
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def channel(receiver, legal, root):
    # Loopback is internal: a platform admin allows it, as for a webhook.
    return chat_channel_create(
        actor=Actor(user=root), department=legal, url=receiver.url, allow_internal=True
    )


def submit_one(lena, legal, seed=71) -> Delivery:
    adapter = make_adapter(lena, legal, name=f"adapter-{seed}", served_name=f"legal-c{seed}")
    version = make_version(lena, adapter, AdapterSpec(seed=seed))
    version_transition(actor=actor(lena), version=version, action="submit")
    fan_out_all()
    return Delivery.objects.select_related("event").get()


def test_a_real_receiver_gets_the_event_as_chat_text(receiver, channel, lena, alex, legal):
    delivery = submit_one(lena, legal)
    assert delivery.webhook_id == channel.pk
    assert delivery_attempt(delivery.pk, "worker-a") == "delivered"

    ((headers, body),) = receiver.received
    message = json.loads(body)
    assert set(message) == {"text"}
    assert delivery.event.title in message["text"]
    assert f"https://registry.example.com{delivery.event.link}" in message["text"]
    assert HEADER not in headers  # a chat service reads no signature
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED
    (attempt,) = delivery.log.all()
    assert attempt.status_code == 200


def test_a_failing_chat_service_is_retried_like_a_webhook(receiver, channel, lena, legal):
    receiver.mode = "error"
    delivery = submit_one(lena, legal, 72)
    assert delivery_attempt(delivery.pk, "worker-a") == "retry"
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING
    assert delivery.last_status_code == 500


def test_the_url_is_kept_encrypted_and_never_shown(as_alex, legal):
    created = as_alex.post(
        "/api/v1/chat-channels/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["url"] == "https://93.184.215.14/…"
    assert "very-secret-path" not in created.content.decode()
    assert "very-secret-path" not in as_alex.get("/api/v1/chat-channels/").content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT chat_url FROM notifications_webhook WHERE id = %s", [body["id"]])
        (stored,) = cursor.fetchone()
    assert "very-secret-path" not in stored
    assert Webhook.objects.get(pk=body["id"]).chat_url == PUBLIC_URL
    audit = AuditEvent.objects.get(action="chat_channel.created")
    assert "very-secret-path" not in json.dumps(audit.details)


def test_an_internal_address_is_refused_naming_the_rule(as_alex, legal):
    response = as_alex.post(
        "/api/v1/chat-channels/",
        {"department": "legal", "url": "http://169.254.169.254/hook"},
        format="json",
    )
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "webhook_url_not_allowed"
    assert "internal address" in error["message"]
    assert not Webhook.objects.exists()


def test_the_address_is_checked_again_at_each_delivery(receiver, channel, legal, lena, alex):
    # As if the name had come to resolve inside since it was added.
    Webhook.objects.filter(pk=channel.pk).update(allow_internal=False)
    delivery = submit_one(lena, legal, 73)
    assert delivery_attempt(delivery.pk, "worker-a") == "failed"
    assert receiver.received == []
    assert "internal address" in delivery.log.get().error


def test_a_member_of_another_department_gets_404(as_fred, legal, root):
    channel = chat_channel_create(actor=Actor(user=root), department=legal, url=PUBLIC_URL)
    assert as_fred.get(f"/api/v1/chat-channels/{channel.pk}/").status_code == 404
    assert (
        as_fred.patch(
            f"/api/v1/chat-channels/{channel.pk}/", {"active": False}, format="json"
        ).status_code
        == 404
    )
    assert as_fred.delete(f"/api/v1/chat-channels/{channel.pk}/").status_code == 404
    created = as_fred.post(
        "/api/v1/chat-channels/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    )
    assert created.status_code == 404
    assert as_fred.get("/api/v1/chat-channels/").json()["results"] == []
    assert as_fred.get("/departments/legal/chat-channels/").status_code == 404


def test_a_member_who_is_not_an_approver_may_not_add_one(as_lena, legal):
    response = as_lena.post(
        "/api/v1/chat-channels/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    )
    assert response.status_code == 403


def test_an_approver_changes_and_removes_one(as_alex, legal):
    body = as_alex.post(
        "/api/v1/chat-channels/", {"department": "legal", "url": PUBLIC_URL}, format="json"
    ).json()
    changed = as_alex.patch(
        f"/api/v1/chat-channels/{body['id']}/",
        {"url": "https://93.184.215.15/other-secret", "kinds": ["rollout.failed"]},
        format="json",
    )
    assert changed.status_code == 200
    assert changed.json()["url"] == "https://93.184.215.15/…"
    assert Webhook.objects.get(pk=body["id"]).chat_url == "https://93.184.215.15/other-secret"
    audit = AuditEvent.objects.get(action="chat_channel.updated")
    assert "other-secret" not in json.dumps(audit.details)
    assert as_alex.delete(f"/api/v1/chat-channels/{body['id']}/").status_code == 204
    assert not Webhook.objects.exists()


def test_chat_channels_and_webhooks_are_listed_apart(as_alex, legal, root):
    channel = chat_channel_create(actor=Actor(user=root), department=legal, url=PUBLIC_URL)
    assert as_alex.get("/api/v1/webhooks/").json()["results"] == []
    assert as_alex.get(f"/api/v1/webhooks/{channel.pk}/").status_code == 404
    listed = as_alex.get("/api/v1/chat-channels/").json()["results"]
    assert [c["id"] for c in listed] == [channel.pk]


def test_the_page_adds_one_and_links_to_its_log(alex, legal):
    from tests.conftest import client_for

    page = client_for(alex)
    added = page.post("/departments/legal/chat-channels/", {"url": PUBLIC_URL})
    assert added.status_code == 201
    assert "very-secret-path" not in added.content.decode()
    channel = Webhook.objects.get()
    assert channel.is_chat and channel.chat_url == PUBLIC_URL
    log = page.get(f"/webhooks/{channel.pk}/")
    assert log.status_code == 200
    assert "Chat channel #" in log.content.decode()
    refused = page.post("/departments/legal/chat-channels/", {"url": "http://10.0.0.7/x"})
    assert refused.status_code == 403
    assert "internal address" in refused.content.decode()


def test_the_admin_shows_a_chat_channel_without_its_url(as_root, root, legal):
    channel = chat_channel_create(actor=Actor(user=root), department=legal, url=PUBLIC_URL)
    page = as_root.get(f"/admin/notifications/webhook/{channel.pk}/change/")
    assert page.status_code == 200
    assert "very-secret-path" not in page.content.decode()
    listing = as_root.get("/admin/notifications/webhook/")
    assert "very-secret-path" not in listing.content.decode()
