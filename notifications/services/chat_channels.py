"""Chat channels: a department's approvers add a Slack- or Teams-compatible
incoming webhook, and the department's events are posted there as text. A
chat channel is a Webhook of format "chat": its deliveries, retries, log,
redelivery and disabling are the webhooks' (services/webhooks.py). Its URL is
the credential, so it is kept encrypted, shown as its host only, and never
written to the audit log; the same address rules as webhooks apply."""

from __future__ import annotations

from django.db import transaction

from core.access import require_approver, require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import NotFound
from core.models import Department
from notifications.addresses import check_url
from notifications.chat import shown_url
from notifications.models import Webhook, WebhookFormat
from notifications.services.webhooks import clean_kinds, save_changes


def chat_channel_create(
    *,
    actor: Actor,
    department: Department,
    url: str,
    description: str = "",
    kinds=None,
    allow_internal: bool = False,
) -> Webhook:
    require_approver(actor, department.pk, "Department")
    if allow_internal:
        require_platform_admin(actor)
    check_url(url, allow_internal=allow_internal)
    with transaction.atomic():
        channel = Webhook.objects.create(
            department=department,
            format=WebhookFormat.CHAT,
            url=shown_url(url),
            chat_url=url,
            description=description,
            secret="",
            kinds=clean_kinds(kinds),
            allow_internal=allow_internal,
            created_by=actor.user,
        )
        audit_record(
            actor=actor,
            action="chat_channel.created",
            obj=channel,
            department=department,
            details={"host": channel.url, "kinds": channel.kinds, "allow_internal": allow_internal},
        )
    return channel


def chat_channel_update(*, actor: Actor, channel: Webhook, **changes) -> Webhook:
    """url, description, kinds, active (re-enabling clears the failure count)."""
    _require_chat(channel)
    require_approver(actor, channel.department_id, "Webhook")
    if "kinds" in changes:
        changes["kinds"] = clean_kinds(changes["kinds"])
    if "url" in changes:
        check_url(changes["url"], allow_internal=channel.allow_internal)
        changes["chat_url"] = changes.pop("url")
        changes["url"] = shown_url(changes["chat_url"])
    return save_changes(
        actor=actor, hook=channel, changes=changes, action="chat_channel.updated", hidden="chat_url"
    )


def chat_channel_delete(*, actor: Actor, channel: Webhook) -> None:
    _require_chat(channel)
    require_approver(actor, channel.department_id, "Webhook")
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="chat_channel.deleted",
            obj=channel,
            department=channel.department,
            details={"host": channel.url},
        )
        channel.delete()


def _require_chat(channel: Webhook) -> None:
    if not channel.is_chat:
        raise NotFound("Chat channel not found.")
