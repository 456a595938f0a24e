from __future__ import annotations

from rest_framework import serializers

from notifications.events import KIND_CHOICES
from notifications.models import (
    Channel,
    Delivery,
    DeliveryAttempt,
    Notification,
    OutboxMail,
    Webhook,
)


class NotificationSerializer(serializers.ModelSerializer):
    kind = serializers.CharField(source="event.kind", read_only=True)
    title = serializers.CharField(source="event.title", read_only=True)
    link = serializers.CharField(
        source="event.link", read_only=True, help_text="The page that needs you."
    )
    event_id = serializers.UUIDField(source="event.uid", read_only=True)
    department = serializers.SlugRelatedField(
        source="event.department", slug_field="slug", read_only=True, allow_null=True
    )
    payload = serializers.JSONField(
        source="event.payload", read_only=True, help_text="The event, as webhooks receive it."
    )
    read = serializers.SerializerMethodField()

    class Meta:
        model = Notification
        fields = [
            "id",
            "kind",
            "title",
            "link",
            "event_id",
            "department",
            "payload",
            "created_at",
            "read",
            "read_at",
            "email_status",
        ]
        read_only_fields = fields

    def get_read(self, notification) -> bool:
        return notification.read_at is not None


class OutboxMailSerializer(serializers.ModelSerializer):
    class Meta:
        model = OutboxMail
        fields = ["id", "to", "subject", "body", "created_at"]
        read_only_fields = fields


class MarkedSerializer(serializers.Serializer):
    marked = serializers.IntegerField(help_text="How many notifications were unread.")


class PreferenceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=KIND_CHOICES)
    channel = serializers.ChoiceField(
        choices=Channel.choices,
        help_text="email: by email and in the app; in_app: in the app only; off: not told.",
    )
    summary = serializers.CharField(read_only=True)
    default = serializers.ChoiceField(choices=Channel.choices, read_only=True)


class WebhookSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=KIND_CHOICES))

    class Meta:
        model = Webhook
        fields = [
            "id",
            "department",
            "url",
            "description",
            "kinds",
            "allow_internal",
            "active",
            "disabled_reason",
            "consecutive_failures",
            "failing_since",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="Shown once, never again: verify signatures with it."
    )

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookCreateSerializer(serializers.Serializer):
    department = serializers.SlugField(help_text="The department whose events it receives.")
    url = serializers.URLField(
        max_length=2000,
        help_text="http(s); a public address unless a platform admin allows internal ones.",
    )
    description = serializers.CharField(
        max_length=300, required=False, allow_blank=True, default=""
    )
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=KIND_CHOICES),
        required=False,
        default=list,
        help_text="Event kinds to send; empty or absent: every kind.",
    )
    allow_internal = serializers.BooleanField(
        required=False, default=False, help_text="Platform admins only."
    )


class WebhookUpdateSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2000, required=False)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=KIND_CHOICES), required=False
    )
    active = serializers.BooleanField(
        required=False, help_text="true re-enables a disabled webhook."
    )


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = [
            "started_at",
            "duration_ms",
            "status_code",
            "error",
            "transient",
            "response_excerpt",
        ]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    event_id = serializers.UUIDField(source="event.uid", read_only=True)
    kind = serializers.CharField(source="event.kind", read_only=True)
    log = DeliveryAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "event_id",
            "kind",
            "status",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_duration_ms",
            "last_error",
            "delivered_at",
            "created_at",
            "log",
        ]
        read_only_fields = fields


class ChatChannelSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=KIND_CHOICES))
    url = serializers.CharField(
        read_only=True,
        help_text="The scheme and host only: the full URL is the channel's credential, "
        "kept encrypted and never shown.",
    )

    class Meta:
        model = Webhook
        fields = [
            "id",
            "department",
            "url",
            "description",
            "kinds",
            "allow_internal",
            "active",
            "disabled_reason",
            "consecutive_failures",
            "failing_since",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class ChatChannelCreateSerializer(WebhookCreateSerializer):
    department = serializers.SlugField(help_text="The department whose events it posts.")
    url = serializers.URLField(
        max_length=2000,
        help_text="The Slack or Teams incoming-webhook URL (http(s); a public address "
        "unless a platform admin allows internal ones).",
    )


class ChatChannelUpdateSerializer(WebhookUpdateSerializer):
    pass
