"""Read-only views for platform admins: the outbox, webhooks and chat
channels (never a secret: a webhook's signing secret, a chat channel's URL)
and the delivery log. Changes go through the API and pages, whose
services audit them."""

from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin
from notifications.models import Delivery, DeliveryAttempt, Event, Webhook


@admin.register(Event)
class EventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "kind", "department", "title", "fanned_out_at"]
    list_filter = ["kind"]
    search_fields = ["uid", "title"]


@admin.register(Webhook)
class WebhookAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "department",
        "format",
        "url",
        "active",
        "consecutive_failures",
        "created_at",
    ]
    list_filter = ["format"]
    exclude = ["secret", "chat_url"]


class AttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = DeliveryAttempt
    extra = 0


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "webhook", "event", "status", "attempts", "last_status_code"]
    list_filter = ["status"]
    inlines = [AttemptInline]
