"""The notifications app's answers to other apps' signals (NotificationsConfig.ready)."""

from __future__ import annotations


def record_event(sender, *, event, **kwargs) -> None:
    from notifications.services.outbox import event_record_from_audit

    event_record_from_audit(event)


def record_drift(sender, *, events, **kwargs) -> None:
    from notifications.services.outbox import drift_record

    drift_record(events)
