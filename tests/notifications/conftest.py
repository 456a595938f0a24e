"""Notification fixtures: running the worker's steps in the test's process,
and the rows of the fixed cast's world (tests/conftest.py)."""

from __future__ import annotations

import pytest

from notifications.models import Event, Notification
from notifications.services.outbox import event_fan_out


def fan_out_all() -> list[Event]:
    """What the worker does after each commit, for every event not yet fanned out."""
    events = list(Event.objects.filter(fanned_out_at__isnull=True).order_by("id"))
    for event in events:
        assert event_fan_out(event.pk, "test-worker")
    return events


def told(kind: str) -> set[str]:
    """The usernames notified of events of `kind`."""
    return set(
        Notification.objects.filter(event__kind=kind).values_list("user__username", flat=True)
    )


@pytest.fixture(autouse=True)
def outbox_mail(settings):
    settings.EMAIL_BACKEND = "notifications.mail_outbox.OutboxBackend"
