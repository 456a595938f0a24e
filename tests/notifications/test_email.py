"""Email goes out from the worker through Django's SMTP backend to a real SMTP
server on loopback (aiosmtpd), as plain text plus HTML, with the link to the
page that needs the reader; a server that is down is retried later."""

from __future__ import annotations

import email
import socket
from email import policy

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from notifications.models import EmailStatus, Notification, OutboxMail
from notifications.services.email import notification_email_send
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter, make_version
from tests.notifications.conftest import fan_out_all
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


class Inbox:
    def __init__(self):
        self.messages: list[email.message.EmailMessage] = []
        self.envelopes = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append((session.authenticated, envelope.rcpt_tos))
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _authenticate(server, session, envelope, mechanism, auth_data):
    ok = auth_data.login == b"registry" and auth_data.password == b"mail-password"
    return AuthResult(success=ok)


@pytest.fixture
def smtp_server(settings):
    inbox = Inbox()
    port = _free_port()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        authenticator=_authenticate,
        auth_require_tls=False,  # loopback only; production uses EMAIL_USE_TLS
    )
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "registry", "mail-password"
    settings.EMAIL_TIMEOUT = 5
    settings.NOTIFICATIONS_SITE_URL = "https://registry.example.com"
    yield inbox
    controller.stop()


@pytest.fixture
def waiting(lena, alex, paula, legal):
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    version = make_version(lena, adapter, AdapterSpec(seed=51))
    version_transition(actor=actor(lena), version=version, action="submit")
    fan_out_all()
    return version


def test_the_approver_gets_an_email_with_text_html_and_the_review_link(smtp_server, waiting, alex):
    notification = Notification.objects.get(user=alex)
    assert notification_email_send(notification.pk, "worker-a") == "sent"

    (message,) = smtp_server.messages
    assert message["To"] == "alex@example.com"
    assert "contracts version 1 waits for your review" in message["Subject"]
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    link = f"https://registry.example.com/versions/{waiting.pk}/"
    assert link in text
    assert f'href="{link}"' in html
    assert "https://registry.example.com/notifications/preferences/" in text
    assert smtp_server.envelopes == [(True, ["alex@example.com"])]  # authenticated
    notification.refresh_from_db()
    assert notification.email_status == EmailStatus.SENT
    assert notification.emailed_at is not None


def test_a_sent_email_is_not_sent_again(smtp_server, waiting, alex):
    notification = Notification.objects.get(user=alex)
    notification_email_send(notification.pk, "worker-a")
    assert notification_email_send(notification.pk, "worker-b") == "done"
    assert len(smtp_server.messages) == 1


def test_a_mail_server_that_is_down_is_tried_again_later(settings, waiting, alex):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", _free_port()  # nobody listens
    settings.EMAIL_USE_TLS = False
    notification = Notification.objects.get(user=alex)

    assert notification_email_send(notification.pk, "worker-a") == "retry"

    notification.refresh_from_db()
    assert notification.email_status == EmailStatus.PENDING
    assert notification.email_attempts == 1
    assert notification.next_email_at > notification.created_at
    assert notification_email_send(notification.pk, "worker-a") == "not due"


def test_the_local_outbox_keeps_the_message_for_the_page(settings, waiting, alex, web_alex):
    settings.EMAIL_BACKEND = "notifications.mail_outbox.OutboxBackend"
    notification = Notification.objects.get(user=alex)
    assert notification_email_send(notification.pk, "worker-a") == "sent"

    (mail,) = OutboxMail.objects.all()
    assert mail.to == "alex@example.com"
    assert "<a href=" in mail.html
    page = web_alex.get("/notifications/outbox/")
    assert page.status_code == 200
    assert "waits for your review" in page.content.decode()


def test_the_outbox_shows_a_person_only_their_own_mail(settings, waiting, alex, web_lena):
    settings.EMAIL_BACKEND = "notifications.mail_outbox.OutboxBackend"
    notification_email_send(Notification.objects.get(user=alex).pk, "worker-a")
    page = web_lena.get("/notifications/outbox/")
    assert page.status_code == 200
    assert "waits for your review" not in page.content.decode()


def test_the_mail_outbox_api_gives_a_person_their_own_mail(
    settings, waiting, alex, as_alex, as_lena, as_root
):
    settings.EMAIL_BACKEND = "notifications.mail_outbox.OutboxBackend"
    notification_email_send(Notification.objects.get(user=alex).pk, "worker-a")
    mail = OutboxMail.objects.get()

    (listed,) = as_alex.get("/api/v1/mail-outbox/").json()["results"]
    assert listed["to"] == "alex@example.com"
    assert "contracts version 1 waits for your review" in listed["subject"]
    assert f"/versions/{waiting.pk}/" in listed["body"]
    assert as_alex.get(f"/api/v1/mail-outbox/{mail.pk}/").json()["id"] == mail.pk
    # Another person's mail is not theirs to read; a platform admin sees the outbox.
    assert as_lena.get("/api/v1/mail-outbox/").json()["count"] == 0
    assert as_lena.get(f"/api/v1/mail-outbox/{mail.pk}/").status_code == 404
    assert as_root.get("/api/v1/mail-outbox/").json()["count"] == 1
