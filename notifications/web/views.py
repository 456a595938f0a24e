"""The notification pages: the inbox, the preferences, the local mail outbox,
and a department's webhooks and chat channels with their delivery log (its
approvers')."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core import selectors as core_selectors
from core.access import can_approve
from core.actors import Actor
from core.errors import ApplicationError
from core.web import errors_on, page, paginate
from notifications import selectors
from notifications.events import KINDS
from notifications.models import Channel
from notifications.services.chat_channels import chat_channel_create
from notifications.services.inbox import (
    notification_mark_read,
    notifications_mark_all_read,
    preference_set,
)
from notifications.services.webhooks import delivery_redeliver, webhook_create, webhook_update


@page
def inbox(request, actor: Actor):
    rows = selectors.notifications_for(actor)
    only_unread = request.GET.get("unread") == "true"
    if only_unread:
        rows = rows.filter(read_at__isnull=True)
    return render(
        request,
        "notifications/inbox.html",
        {
            "notifications": paginate(request, rows, 30),
            "only_unread": only_unread,
            # Where the viewer manages webhooks: the departments they approve in.
            "webhook_departments": [
                d for d in core_selectors.departments_for(actor) if can_approve(actor, d.pk)
            ],
        },
    )


@require_POST
@page
def open_notification(request, actor: Actor, pk: int):
    """Marks it read and goes to the page that needs the reader."""
    notification = selectors.notification_get(actor, pk)
    notification_mark_read(actor=actor, notification=notification)
    link = notification.event.link
    if link and url_has_allowed_host_and_scheme(link, {request.get_host()}, request.is_secure()):
        return redirect(link)
    return redirect("notifications:inbox")


@require_POST
@page
def read_all(request, actor: Actor):
    marked = notifications_mark_all_read(actor=actor)
    messages.success(request, f"Marked {marked} read.")
    return redirect("notifications:inbox")


@page
def preferences(request, actor: Actor):
    if request.method == "POST":
        for kind in KINDS:
            channel = request.POST.get(f"kind-{kind}")
            if channel is not None:
                try:
                    preference_set(actor=actor, kind=kind, channel=channel)
                except ApplicationError as error:
                    messages.error(request, error.message)
                    break
        else:
            messages.success(request, "Saved how you are told.")
        return redirect("notifications:preferences")
    return render(
        request,
        "notifications/preferences.html",
        {"rows": selectors.preferences_for(actor), "channels": Channel.choices},
    )


@page
def outbox(request, actor: Actor):
    from django.conf import settings

    return render(
        request,
        "notifications/outbox.html",
        {
            "mails": paginate(request, selectors.outbox_for(actor), 20),
            "local": settings.EMAIL_BACKEND == "notifications.mail_outbox.OutboxBackend",
        },
    )


class WebhookForm(forms.Form):
    url = forms.URLField(max_length=2000, label="URL", assume_scheme="https")
    description = forms.CharField(max_length=300, required=False)
    kinds = forms.MultipleChoiceField(
        choices=[(k, k) for k in KINDS],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every kind.",
    )


@page
def webhooks(request, actor: Actor, slug: str):
    department = core_selectors.department_get(actor, slug)  # outsiders: 404
    if not can_approve(actor, department.pk):
        raise PermissionDenied("Only the department's approvers manage its webhooks.")
    rows = selectors.webhooks_of(actor, department)
    form = WebhookForm(request.POST or None)
    context: dict = {"department": department, "form": form}
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            with errors_on(form) as outcome:
                webhook, secret = webhook_create(
                    actor=actor,
                    department=department,
                    url=form.cleaned_data["url"],
                    description=form.cleaned_data["description"],
                    kinds=form.cleaned_data["kinds"],
                )
            status = outcome.status
            if not outcome.failed:
                context.update(new_webhook=webhook, new_secret=secret, form=WebhookForm())
                status = 201
    context["webhooks"] = rows
    response = render(request, "notifications/webhooks.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the secret is on this page once
    return response


class ChatChannelForm(WebhookForm):
    url = forms.URLField(
        max_length=2000,
        label="Incoming webhook URL",
        assume_scheme="https",
        help_text="From Slack (an app's incoming webhook) or Teams (a channel's workflow "
        "or connector).",
    )


@page
def chat_channels(request, actor: Actor, slug: str):
    department = core_selectors.department_get(actor, slug)  # outsiders: 404
    if not can_approve(actor, department.pk):
        raise PermissionDenied("Only the department's approvers manage its chat channels.")
    form = ChatChannelForm(request.POST or None)
    context: dict = {"department": department, "form": form}
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            with errors_on(form) as outcome:
                channel = chat_channel_create(
                    actor=actor,
                    department=department,
                    url=form.cleaned_data["url"],
                    description=form.cleaned_data["description"],
                    kinds=form.cleaned_data["kinds"],
                )
            status = outcome.status
            if not outcome.failed:
                context.update(new_channel=channel, form=ChatChannelForm())
                status = 201
    context["channels"] = selectors.webhooks_of(actor, department, selectors.CHAT)
    return render(request, "notifications/chat_channels.html", context, status=status)


@page
def webhook_detail(request, actor: Actor, pk: int):
    # A chat channel's log is a webhook's: the same page.
    webhook = selectors.webhook_get(actor, pk, selectors.ANY)
    if request.method == "POST":
        try:
            webhook_update(actor=actor, webhook=webhook, active=request.POST.get("active") == "1")
        except ApplicationError as error:
            messages.error(request, error.message)
        return redirect("notifications:webhook", pk=webhook.pk)
    return render(
        request,
        "notifications/webhook.html",
        {
            "webhook": webhook,
            "deliveries": paginate(
                request, selectors.deliveries_of(webhook).prefetch_related("log"), 20
            ),
        },
    )


@require_POST
@page
def redeliver(request, actor: Actor, pk: int, delivery: int):
    webhook = selectors.webhook_get(actor, pk, selectors.ANY)
    found = selectors.delivery_get(actor, webhook, delivery)
    try:
        delivery_redeliver(actor=actor, delivery=found)
        messages.success(request, "Sent again; the log shows the outcome.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return redirect("notifications:webhook", pk=webhook.pk)
