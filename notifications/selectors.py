"""Reads: a person's notifications and choices, a department's webhooks and
their deliveries (approvers only: a webhook's URL is the department's
business), the outbox, and what the sweeper must send again."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from core.access import can_approve, require_approver, require_visible
from core.actors import Actor
from core.errors import NotFound
from core.models import Department
from notifications.events import KINDS
from notifications.models import (
    Delivery,
    DeliveryStatus,
    EmailStatus,
    Event,
    Notification,
    OutboxMail,
    Preference,
    Webhook,
    WebhookFormat,
)


def notifications_for(actor: Actor) -> QuerySet[Notification]:
    """The viewer's own, shown in the app. A token acts for a department, not
    for a person: it has none."""
    if actor.token is not None:
        return Notification.objects.none()
    return (
        Notification.objects.filter(user=actor.user)
        .select_related("event", "event__department")
        .order_by("-created_at", "-id")
    )


def unread_count(actor: Actor) -> int:
    return notifications_for(actor).filter(read_at__isnull=True).count()


def _one(rows: QuerySet, pk, label: str):
    """The row `pk` among `rows` (what the viewer may see), else a 404."""
    found = rows.filter(pk=pk).first()
    if found is None:
        raise NotFound(f"{label} not found.")
    return found


def notification_get(actor: Actor, pk) -> Notification:
    return _one(notifications_for(actor), pk, "Notification")


def preferences_for(actor: Actor) -> list[dict]:
    """Every kind with the person's choice or the default."""
    chosen = dict(Preference.objects.filter(user=actor.user).values_list("kind", "channel"))
    return [
        {
            "kind": kind.name,
            "summary": kind.summary,
            "channel": chosen.get(kind.name, kind.default),
            "default": kind.default,
        }
        for kind in KINDS.values()
    ]


# Pipelines' signed webhooks and chat channels share the table and the delivery
# machinery; each has its own API and page, so each reads only its format.
SIGNED = (WebhookFormat.SIGNED,)
CHAT = (WebhookFormat.CHAT,)
ANY = (WebhookFormat.SIGNED, WebhookFormat.CHAT)


def webhooks_of(actor: Actor, department: Department, formats=SIGNED) -> QuerySet[Webhook]:
    require_approver(actor, department.pk, "Department")
    return Webhook.objects.filter(department=department, format__in=formats).select_related(
        "department"
    )


def webhooks_for(actor: Actor, formats=SIGNED) -> QuerySet[Webhook]:
    """Every webhook of the departments the viewer approves in (all for admins)."""
    from core.access import approver_department_ids

    ids = approver_department_ids(actor)
    rows = (
        Webhook.objects.filter(format__in=formats)
        .select_related("department")
        .order_by("department__slug", "id")
    )
    return rows if ids is None else rows.filter(department_id__in=ids)


def webhook_get(actor: Actor, pk, formats=SIGNED) -> Webhook:
    label = "Chat channel" if formats == CHAT else "Webhook"
    webhook = Webhook.objects.select_related("department").filter(pk=pk, format__in=formats).first()
    if webhook is None:
        raise NotFound(f"{label} not found.")
    require_visible(actor, webhook.department_id, label)
    if not can_approve(actor, webhook.department_id):
        # Members of the department are not told its webhooks' addresses either.
        raise NotFound(f"{label} not found.")
    return webhook


def deliveries_of(webhook: Webhook) -> QuerySet[Delivery]:
    return webhook.deliveries.select_related("event").order_by("-created_at", "-id")


def delivery_get(actor: Actor, webhook: Webhook, pk) -> Delivery:
    return _one(deliveries_of(webhook), pk, "Delivery")


def outbox_for(actor: Actor) -> QuerySet[OutboxMail]:
    """Platform admins see every kept message; a person those sent to them."""
    if actor.is_platform_admin:
        return OutboxMail.objects.all()
    if actor.token is not None or not actor.user.email:
        return OutboxMail.objects.none()
    return OutboxMail.objects.filter(to=actor.user.email)


def mail_get(actor: Actor, pk: int) -> OutboxMail:
    return _one(outbox_for(actor), pk, "Mail")


# --- What the sweeper sends again ---------------------------------------------


def _free(now) -> Q:
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def events_to_resend(now, stale) -> list[int]:
    return list(
        Event.objects.filter(fanned_out_at__isnull=True)
        .filter(_free(now))
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale))
        .order_by("id")
        .values_list("pk", flat=True)
    )


def emails_due(now, stale) -> list[int]:
    return list(
        Notification.objects.filter(email_status=EmailStatus.PENDING, next_email_at__lte=stale)
        .filter(_free(now))
        .order_by("next_email_at")
        .values_list("pk", flat=True)
    )


def deliveries_due(now, stale) -> list[int]:
    # A new delivery was sent on the fan-out's commit; its retries have
    # attempts > 0 and are sent by this sweep once their time has come.
    return list(
        Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .filter(Q(attempts__gt=0) | Q(created_at__lt=stale))
        .filter(_free(now))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)
    )
