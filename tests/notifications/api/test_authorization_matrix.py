"""The notification, preference, webhook and chat channel endpoints x every kind of caller,
each cell asserting the exact status.

Notifications (and the mail kept for a person) are a person's: a token gets
403 on each of them. Webhooks are
the department's approvers': a member is not told they exist (404), an
outsider neither.

The world each cell starts from: lena (member) holds a notification of an
approved version of Legal's adapter; Legal has a webhook and a chat channel (root added
them, to loopback URLs only a platform admin may allow) with one delivery each.
"""

from __future__ import annotations

import pytest

from core.actors import Actor
from notifications.models import Delivery, Notification, OutboxMail
from notifications.services.chat_channels import chat_channel_create
from notifications.services.webhooks import webhook_create
from tests.factories import make_adapter, make_approved_version
from tests.notifications.conftest import fan_out_all
from tests.support.adapters import AdapterSpec
from tests.support.authorization import CALLERS, assert_status, caller_client, statuses

PUBLIC_URL = "https://93.184.215.14/hooks/registry"

# name: (method, path template, body builder, expected statuses)
MATRIX = {
    "list notifications": (
        "get",
        "/api/v1/notifications/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "get a notification": (
        "get",
        "/api/v1/notifications/{notification}/",
        None,
        # Only its person sees it; an admin is not told of another's either.
        statuses(401, 404, 200, 404, 403, 404),
    ),
    "mark a notification read": (
        "post",
        "/api/v1/notifications/{notification}/read/",
        None,
        statuses(401, 404, 200, 404, 403, 404),
    ),
    "mark every notification read": (
        "post",
        "/api/v1/notifications/read-all/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "list preferences": (
        "get",
        "/api/v1/notification-preferences/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "set a preference": (
        "post",
        "/api/v1/notification-preferences/",
        lambda w: {"kind": "version.submitted", "channel": "in_app"},
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "list the mail outbox": (
        "get",
        "/api/v1/mail-outbox/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "get a mail": (
        "get",
        "/api/v1/mail-outbox/{mail}/",
        None,
        # lena's mail: hers, and a platform admin's, who sees the whole outbox.
        statuses(401, 404, 200, 404, 403, 200),
    ),
    "list webhooks": (
        "get",
        "/api/v1/webhooks/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "add a webhook": (
        "post",
        "/api/v1/webhooks/",
        lambda w: {"department": "legal", "url": PUBLIC_URL},
        statuses(401, 404, 403, 201, 403, 201),
    ),
    "add a webhook to an internal address": (
        "post",
        "/api/v1/webhooks/",
        lambda w: {"department": "legal", "url": "http://127.0.0.1:9/x", "allow_internal": True},
        # Only a platform admin may allow an internal address.
        statuses(401, 404, 403, 403, 403, 201),
    ),
    "get a webhook": (
        "get",
        "/api/v1/webhooks/{webhook}/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "change a webhook": (
        "patch",
        "/api/v1/webhooks/{webhook}/",
        lambda w: {"description": "CI", "kinds": ["version.approved"]},
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "delete a webhook": (
        "delete",
        "/api/v1/webhooks/{webhook}/",
        None,
        statuses(401, 404, 404, 204, 403, 204),
    ),
    "list a webhook's deliveries": (
        "get",
        "/api/v1/webhooks/{webhook}/deliveries/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "redeliver": (
        "post",
        "/api/v1/webhooks/{webhook}/deliveries/{delivery}/redeliver/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "list chat channels": (
        "get",
        "/api/v1/chat-channels/",
        None,
        statuses(401, 200, 200, 200, 403, 200),
    ),
    "add a chat channel": (
        "post",
        "/api/v1/chat-channels/",
        lambda w: {"department": "legal", "url": PUBLIC_URL},
        statuses(401, 404, 403, 201, 403, 201),
    ),
    "add a chat channel to an internal address": (
        "post",
        "/api/v1/chat-channels/",
        lambda w: {"department": "legal", "url": "http://127.0.0.1:9/x", "allow_internal": True},
        # Only a platform admin may allow an internal address.
        statuses(401, 404, 403, 403, 403, 201),
    ),
    "get a chat channel": (
        "get",
        "/api/v1/chat-channels/{chat}/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "change a chat channel": (
        "patch",
        "/api/v1/chat-channels/{chat}/",
        lambda w: {"description": "CI", "kinds": ["version.approved"]},
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "delete a chat channel": (
        "delete",
        "/api/v1/chat-channels/{chat}/",
        None,
        statuses(401, 404, 404, 204, 403, 204),
    ),
    "list a chat channel's deliveries": (
        "get",
        "/api/v1/chat-channels/{chat}/deliveries/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
    "redeliver to a chat channel": (
        "post",
        "/api/v1/chat-channels/{chat}/deliveries/{chat_delivery}/redeliver/",
        None,
        statuses(401, 404, 404, 200, 403, 200),
    ),
}

CELLS = [pytest.param(name, caller, id=f"{name}-{caller}") for name in MATRIX for caller in CALLERS]


@pytest.fixture
def world(legal, lena, alex, root):
    webhook, _ = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    chat = chat_channel_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/c", allow_internal=True
    )
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    make_approved_version(lena, alex, adapter, AdapterSpec(seed=31))
    fan_out_all()
    notification = Notification.objects.get(user=lena, event__kind="version.approved")
    delivery = Delivery.objects.filter(webhook=webhook).first()
    chat_delivery = Delivery.objects.filter(webhook=chat).first()
    mail = OutboxMail.objects.create(to=lena.email, subject="[LoRA Registry] hello", body="hi")
    return {
        "mail": mail.pk,
        "notification": notification.pk,
        "webhook": webhook.pk,
        "delivery": delivery.pk,
        "chat": chat.pk,
        "chat_delivery": chat_delivery.pk,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint,caller", CELLS)
def test_authorization_matrix(endpoint, caller, world, fred, lena, alex, root, legal_token):
    method, template, body, expected = MATRIX[endpoint]
    client = caller_client(caller, fred, lena, alex, root, legal_token)
    url = template.format(**world)
    data = body(world) if body else None
    response = getattr(client, method)(url, data, format="json")

    assert_status(response, expected[caller])
