"""A person's side: reading notifications and choosing how each kind reaches them."""

from __future__ import annotations

from django.utils import timezone

from core.actors import Actor
from core.errors import NotAuthorized, ValidationFailed
from notifications.events import KINDS
from notifications.models import Channel, Notification, Preference


def _require_person(actor: Actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Notifications are a person's; a token has none.", code="token_forbidden"
        )


def notification_mark_read(*, actor: Actor, notification: Notification) -> Notification:
    _require_person(actor)
    if notification.read_at is None:
        # Only if still unread: a second click keeps the first time.
        now = timezone.now()
        if Notification.objects.filter(pk=notification.pk, read_at__isnull=True).update(
            read_at=now
        ):
            notification.read_at = now
        else:
            notification.refresh_from_db(fields=["read_at"])
    return notification


def notifications_mark_all_read(*, actor: Actor) -> int:
    _require_person(actor)
    return Notification.objects.filter(user=actor.user, read_at__isnull=True).update(
        read_at=timezone.now()
    )


def preference_set(*, actor: Actor, kind: str, channel: str) -> Preference:
    _require_person(actor)
    if kind not in KINDS:
        raise ValidationFailed(
            f"Unknown event kind {kind!r}. Known: {', '.join(KINDS)}.", code="unknown_event_kind"
        )
    if channel not in Channel.values:
        raise ValidationFailed(
            f"channel must be one of {', '.join(Channel.values)}.", code="unknown_channel"
        )
    preference, _ = Preference.objects.update_or_create(
        user=actor.user, kind=kind, defaults={"channel": channel}
    )
    return preference
