"""Celery tasks: thin and idempotent, each takes an id and calls one service.
The sweeper sends again what nobody holds and is still due (a broker that was
down, a worker killed mid-way), and is what drives a webhook's retries."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from celery import shared_task
from django.utils import timezone

# How long a row may wait after being sent before the sweeper sends it again.
RESEND_AFTER_SECONDS = 30
SWEEP_BATCH = 500


def worker_id(task_id: str | None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or 'eager'}"[:100]


@shared_task(name="notifications.fan_out", bind=True, acks_late=True, ignore_result=True)
def fan_out(self, event_id: int) -> bool:
    from notifications.services.outbox import event_fan_out

    return event_fan_out(event_id, worker_id(self.request.id))


@shared_task(name="notifications.send_email", bind=True, acks_late=True, ignore_result=True)
def send_email(self, notification_id: int) -> str:
    from notifications.services.email import notification_email_send

    return notification_email_send(notification_id, worker_id(self.request.id))


@shared_task(name="notifications.deliver", bind=True, acks_late=True, ignore_result=True)
def deliver(self, delivery_id: int) -> str:
    from notifications.services.webhooks import delivery_attempt

    return delivery_attempt(delivery_id, worker_id(self.request.id))


@shared_task(name="notifications.expiring", acks_late=True, ignore_result=True)
def expiring() -> int:
    """Tells of the inference keys and grants that end within 7 days, once each."""
    from notifications.services.expiring import expiring_record

    return expiring_record()


@shared_task(name="notifications.budgets", acks_late=True, ignore_result=True)
def budgets() -> int:
    """Tells of the departments at 80 % or 100 % of a token budget, once each."""
    from notifications.services.budgets import budgets_record

    return budgets_record()


@shared_task(name="notifications.out_of_sync", acks_late=True, ignore_result=True)
def out_of_sync() -> int:
    """Tells of the replicas out of sync past the bound, once per episode."""
    from notifications.services.out_of_sync import out_of_sync_record

    return out_of_sync_record()


@shared_task(name="notifications.sweep", acks_late=True, ignore_result=True)
def sweep() -> dict:
    from notifications import selectors
    from notifications.models import Event

    now = timezone.now()
    stale = now - timedelta(seconds=RESEND_AFTER_SECONDS)
    events = selectors.events_to_resend(now, stale)[:SWEEP_BATCH]
    Event.objects.filter(pk__in=events).update(enqueued_at=now)
    for pk in events:
        fan_out.delay(pk)
    emails = selectors.emails_due(now, stale)[:SWEEP_BATCH]
    for pk in emails:
        send_email.delay(pk)
    deliveries = selectors.deliveries_due(now, stale)[:SWEEP_BATCH]
    for pk in deliveries:
        deliver.delay(pk)
    return {"events": len(events), "emails": len(emails), "deliveries": len(deliveries)}
