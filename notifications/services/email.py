"""Email: one message per notification that wants it, sent by a worker through
Django's email backend (settings: SMTP with TLS in production, the local
outbox under `make run`), plain text plus HTML from templates.

Sending is claimed (core.claims) and marked sent after the backend answered: a
worker killed between the two sends it again (at least once), never never."""

from __future__ import annotations

import logging
import smtplib
from datetime import timedelta

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string
from django.utils import timezone

from core.backoff import backoff_delay
from core.claims import Lease
from notifications.events import KINDS
from notifications.models import EmailStatus, Notification

logger = logging.getLogger(__name__)

EMAIL_LEASE = Lease(Notification, "claimed_by", "claimed_until")
# A mail server that is down for a while: retried for about three hours.
MAX_EMAIL_ATTEMPTS = 8
CLAIM_SECONDS = 120.0


def notification_email_message(notification: Notification) -> EmailMultiAlternatives:
    event = notification.event
    site = settings.NOTIFICATIONS_SITE_URL.rstrip("/")
    context = {
        "user": notification.user,
        "event": event,
        "kind": KINDS.get(event.kind),
        "data": event.payload.get("data", {}),
        "url": f"{site}{event.link}" if event.link else site,
        "preferences_url": f"{site}/notifications/preferences/",
    }
    text = render_to_string("notifications/email/event.txt", context)
    html = render_to_string("notifications/email/event.html", context)
    message = EmailMultiAlternatives(
        subject=f"[LoRA Registry] {event.title}"[:250],
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[notification.user.email],
        headers={"X-LoRA-Registry-Event": str(event.uid)},
    )
    message.attach_alternative(html, "text/html")
    return message


def notification_email_send(notification_id: int, owner: str) -> str:
    """Sends one notification's email if it is due. Returns what happened."""
    if not EMAIL_LEASE.claim(notification_id, owner, CLAIM_SECONDS):
        return "busy"
    try:
        notification = (
            Notification.objects.select_related("user", "event").filter(pk=notification_id).first()
        )
        if notification is None or notification.email_status != EmailStatus.PENDING:
            return "done"
        if notification.next_email_at and notification.next_email_at > timezone.now():
            return "not due"
        if not notification.user.is_active or not notification.user.email:
            _mark(notification, owner, status=EmailStatus.FAILED)
            return "no recipient"
        try:
            message = notification_email_message(notification)
            message.connection = get_connection(timeout=settings.EMAIL_TIMEOUT)
            message.send()
        except (OSError, smtplib.SMTPException) as error:  # socket, TLS, SMTP: retry later
            attempts = notification.email_attempts + 1
            logger.warning(
                "notification %s: email failed (attempt %s): %s",
                notification_id,
                attempts,
                type(error).__name__,
            )
            if attempts >= MAX_EMAIL_ATTEMPTS:
                _mark(notification, owner, status=EmailStatus.FAILED, email_attempts=attempts)
                return "failed"
            delay = backoff_delay(attempts - 1, base=60, cap=3600, jitter=True)
            _mark(
                notification,
                owner,
                email_attempts=attempts,
                next_email_at=timezone.now() + timedelta(seconds=delay),
            )
            return "retry"
        _mark(notification, owner, status=EmailStatus.SENT, emailed_at=timezone.now())
        return "sent"
    finally:
        EMAIL_LEASE.release(notification_id, owner)


def _mark(notification: Notification, owner: str, status: str | None = None, **changes) -> None:
    # Only while we hold it and it is still pending: a claim that expired
    # mid-send and was taken by another worker leaves its outcome to that one.
    if status is not None:
        changes["email_status"] = status
    Notification.objects.filter(
        pk=notification.pk, claimed_by=owner, email_status=EmailStatus.PENDING
    ).update(**changes)
