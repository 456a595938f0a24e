"""The unread badge in the navigation, counted lazily: pages that never show
the navigation cost no query."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject


def badge(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}

    def unread() -> int:
        from notifications.models import Notification

        return Notification.objects.filter(user=user, read_at__isnull=True).count()

    return {"unread_notifications": SimpleLazyObject(unread)}
