"""What the product tells people and pipelines: the outbox of events, each
person's notifications and choices, the local mail outbox, and each
department's outbound webhooks with their delivery log.

Behaviour lives in services/ (writes) and selectors.py (reads); the catalog of
events is events.py; docs/operators/notifications.md and docs/pipelines/webhooks.md.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.fields import EncryptedTextField
from core.models import Department


class Event(models.Model):
    """One outbox row: written in the transaction of the change it tells about,
    fanned out to notifications and deliveries by a worker after the commit."""

    # The idempotency id receivers dedupe on: the same for every delivery and redelivery.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=64, db_index=True)
    # The payload's schema version for this kind (events.py).
    schema_version = models.PositiveSmallIntegerField(default=1)
    # Null for platform events (platform admins are told).
    department = models.ForeignKey(
        Department, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    # Departments whose members may be told, and whose webhooks receive it (a
    # grant concerns the adapter's department and the calling one).
    audience = models.JSONField(default=list)
    # Who is concerned, resolved at fan-out: {"people": [user ids],
    # "approvers_of": [department ids], "except": [user ids]}.
    concerns = models.JSONField(default=dict)
    title = models.CharField(max_length=300)
    # The page that needs the reader, relative to the site.
    link = models.CharField(max_length=500, blank=True)
    payload = models.JSONField()
    # For events no change causes (a key about to expire): one per subject and date.
    dedupe_key = models.CharField(max_length=200, null=True, blank=True, unique=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    fanned_out_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=100, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["fanned_out_at", "claimed_until"], name="event_pending")]

    def __str__(self) -> str:
        return f"{self.kind} {self.uid}"


class Channel(models.TextChoices):
    EMAIL = "email", "Email and in the app"
    IN_APP = "in_app", "In the app only"
    OFF = "off", "Off"


class EmailStatus(models.TextChoices):
    NONE = "none", "Not wanted"
    PENDING = "pending", "Waiting to be sent"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class Notification(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="notifications")
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)
    email_status = models.CharField(
        max_length=8, choices=EmailStatus.choices, default=EmailStatus.NONE
    )
    email_attempts = models.PositiveSmallIntegerField(default=0)
    next_email_at = models.DateTimeField(null=True, blank=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=100, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "event"], name="one_notification_per_event")
        ]
        indexes = [
            models.Index(fields=["user", "read_at"], name="notification_unread"),
            models.Index(fields=["email_status", "next_email_at"], name="notification_email_due"),
        ]

    def __str__(self) -> str:
        return f"{self.event.kind} for {self.user}"


class Preference(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences"
    )
    kind = models.CharField(max_length=64)
    channel = models.CharField(max_length=8, choices=Channel.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="one_preference_per_kind")
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.kind} by {self.channel}"


class OutboxMail(models.Model):
    """A message the local mail backend kept instead of sending (`make run`):
    shown on the outbox page, so a newcomer sees what would have been mailed."""

    to = models.CharField(max_length=1000)
    subject = models.CharField(max_length=300)
    body = models.TextField()
    html = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.subject} to {self.to}"


class WebhookFormat(models.TextChoices):
    SIGNED = "signed", "Signed JSON, for pipelines"
    CHAT = "chat", "Chat channel (a Slack or Teams incoming webhook)"


class Webhook(models.Model):
    """Where a department's events are POSTed: a pipeline's signed webhook, or
    a chat channel's incoming webhook. Both share the deliveries, retries,
    log and disabling below (docs/operators/notifications.md)."""

    department = models.ForeignKey(Department, on_delete=models.CASCADE, related_name="webhooks")
    format = models.CharField(
        max_length=8, choices=WebhookFormat.choices, default=WebhookFormat.SIGNED
    )
    # Checked by notifications.addresses (scheme, no credentials, public address).
    # A chat channel's is only its scheme and host, for showing: see chat_url.
    url = models.CharField(max_length=2000)
    # A chat channel's full incoming-webhook URL: whoever holds it may post to
    # the channel, so it is a secret, kept encrypted and never shown again.
    chat_url = EncryptedTextField(blank=True)
    description = models.CharField(max_length=300, blank=True)
    # Signs every delivery; shown once when created, kept encrypted.
    secret = EncryptedTextField()
    # Event kinds sent; empty sends every kind of the department.
    kinds = models.JSONField(default=list, blank=True)
    # Internal addresses (loopback, private networks) are refused unless a
    # platform admin allowed them for this webhook.
    allow_internal = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    # When the failures in a row began (none: the last attempt was delivered).
    failing_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["department__slug", "id"]

    def __str__(self) -> str:
        return f"webhook #{self.pk} of {self.department.slug}"

    @property
    def is_chat(self) -> bool:
        return self.format == WebhookFormat.CHAT

    @property
    def target(self) -> str:
        """The URL deliveries are POSTed to."""
        return self.chat_url if self.is_chat else self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed (gave up)"


class Delivery(models.Model):
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_by = models.CharField(max_length=100, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["webhook", "event"], name="one_delivery_per_event"),
            models.CheckConstraint(
                condition=~Q(status="pending") | Q(next_attempt_at__isnull=False),
                name="pending_delivery_has_a_time",
            ),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.event.kind} to webhook #{self.webhook_id} ({self.status})"


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    transient = models.BooleanField(default=False)
    # The start of the receiver's answer, to debug with.
    response_excerpt = models.CharField(max_length=500, blank=True)
    manual = models.BooleanField(default=False)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"attempt of delivery {self.delivery_id}: {self.status_code or self.error}"


class SyncEpisode(models.Model):
    """A replica out of sync, from when the notifications' check first saw it
    so until it is back in sync (the row is then deleted): what makes
    `replica.out_of_sync` told once per episode (services/out_of_sync.py)."""

    replica = models.OneToOneField(
        "serving.Replica", on_delete=models.CASCADE, related_name="+", primary_key=True
    )
    out_since = models.DateTimeField()

    def __str__(self) -> str:
        return f"replica {self.replica_id} out of sync since {self.out_since:%Y-%m-%d %H:%M}"
