"""/api/v1/notifications/, /api/v1/notification-preferences/, /api/v1/mail-outbox/,
/api/v1/webhooks/ and /api/v1/chat-channels/: a person's notifications, choices
and locally kept mail, and a department's outbound webhooks and chat channels
(its approvers'), with their delivery log
(docs/operators/notifications.md, docs/pipelines/webhooks.md)."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from core.api.views import ActorMixin, schema_only
from core.errors import NotAuthorized, NotFound, ReferenceNotFound, ValidationFailed
from core.models import Department
from notifications import selectors
from notifications.api import serializers as ns
from notifications.models import DeliveryAttempt, Notification, OutboxMail, Webhook
from notifications.services.chat_channels import (
    chat_channel_create,
    chat_channel_delete,
    chat_channel_update,
)
from notifications.services.inbox import (
    notification_mark_read,
    notifications_mark_all_read,
    preference_set,
)
from notifications.services.webhooks import (
    delivery_redeliver,
    webhook_create,
    webhook_delete,
    webhook_update,
)


def _person_only(actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Notifications are a person's; a token has none.", code="token_forbidden"
        )


UNREAD = OpenApiParameter(
    "unread",
    OpenApiTypes.STR,
    enum=["true", "false"],
    description="true: only unread ones; false: only read ones.",
)


@extend_schema_view(
    list=extend_schema(parameters=[UNREAD]),
    read=extend_schema(request=None, responses=ns.NotificationSerializer),
    read_all=extend_schema(request=None, responses=ns.MarkedSerializer),
)
class NotificationViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Your notifications, newest first. Tokens have none (403)."""

    serializer_class = ns.NotificationSerializer
    queryset = Notification.objects.none()
    ordering_fields = ["created_at"]

    def get_queryset(self):
        if schema_only(self):
            return Notification.objects.none()
        _person_only(self.actor)
        rows = selectors.notifications_for(self.actor)
        unread = self.request.query_params.getlist("unread")
        if unread:
            if len(unread) > 1 or unread[0] not in ("true", "false"):
                raise ValidationFailed("unread must be true or false.", code="invalid_unread")
            rows = rows.filter(read_at__isnull=unread[0] == "true")
        return rows

    def get_object(self):
        _person_only(self.actor)
        return selectors.notification_get(self.actor, self.lookup_id())

    @action(detail=True, methods=["post"])
    def read(self, request, pk=None):
        """Marks it read (again: keeps the first time)."""
        notification = notification_mark_read(actor=self.actor, notification=self.get_object())
        return Response(ns.NotificationSerializer(notification).data)

    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request):
        """Marks every one of yours read."""
        return Response({"marked": notifications_mark_all_read(actor=self.actor)})


@extend_schema_view(
    list=extend_schema(responses=ns.PreferenceSerializer(many=True)),
    create=extend_schema(request=ns.PreferenceSerializer, responses={200: ns.PreferenceSerializer}),
)
class PreferenceViewSet(ActorMixin, viewsets.GenericViewSet):
    """How each kind of event reaches you: email (and in the app), in the app, or off."""

    serializer_class = ns.PreferenceSerializer
    pagination_class = None
    filter_backends: list = []

    def list(self, request):
        _person_only(self.actor)
        return Response(selectors.preferences_for(self.actor))

    def create(self, request):
        """Sets your choice for one kind."""
        _person_only(self.actor)
        data = ns.PreferenceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        preference = preference_set(actor=self.actor, **data.validated_data)
        chosen = next(
            p for p in selectors.preferences_for(self.actor) if p["kind"] == preference.kind
        )
        return Response(chosen)


class MailOutboxViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """The emails the local mail backend kept instead of sending (`make run`'s
    default, EMAIL_BACKEND=notifications.mail_outbox.OutboxBackend), newest
    first: yours, or every one for a platform admin. Empty where the registry
    sends its mail. Tokens have none (403)."""

    serializer_class = ns.OutboxMailSerializer
    queryset = OutboxMail.objects.none()
    ordering_fields = ["created_at"]

    def get_queryset(self):
        if schema_only(self):
            return OutboxMail.objects.none()
        _person_only(self.actor)
        return selectors.outbox_for(self.actor)

    def get_object(self):
        _person_only(self.actor)
        return selectors.mail_get(self.actor, self.lookup_id())


def _department(slug: str) -> Department:
    department = Department.objects.filter(slug=slug).first()
    if department is None:
        raise ReferenceNotFound(f"No department {slug!r}.", code="department_not_found")
    return department


@extend_schema_view(
    create=extend_schema(
        request=ns.WebhookCreateSerializer, responses={201: ns.WebhookCreatedSerializer}
    ),
    partial_update=extend_schema(request=ns.WebhookUpdateSerializer),
    deliveries=extend_schema(responses=ns.DeliverySerializer(many=True)),
    redeliver=extend_schema(
        request=None,
        responses=ns.DeliverySerializer,
        parameters=[OpenApiParameter("delivery", OpenApiTypes.INT, OpenApiParameter.PATH)],
    ),
)
class WebhookViewSet(
    ActorMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Outbound webhooks of the departments you approve in (platform admins: all)."""

    serializer_class: type[BaseSerializer] = ns.WebhookSerializer
    queryset = Webhook.objects.none()
    ordering_fields = ["created_at"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if schema_only(self):
            return Webhook.objects.none()
        _person_only(self.actor)
        return selectors.webhooks_for(self.actor)

    def get_object(self):
        _person_only(self.actor)
        return selectors.webhook_get(self.actor, self.lookup_id())

    def create(self, request):
        """Approvers of the department; the secret is in this answer only."""
        data = ns.WebhookCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = _department(values.pop("department"))
        webhook, secret = webhook_create(actor=self.actor, department=department, **values)
        body = ns.WebhookCreatedSerializer(webhook).data
        body["secret"] = secret
        return Response(body, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        data = ns.WebhookUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        webhook = webhook_update(actor=self.actor, webhook=self.get_object(), **data.validated_data)
        return Response(ns.WebhookSerializer(webhook).data)

    def destroy(self, request, pk=None):
        webhook_delete(actor=self.actor, webhook=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The delivery log, newest first, each with its attempts."""
        rows = selectors.deliveries_of(self.get_object()).prefetch_related(
            Prefetch("log", queryset=DeliveryAttempt.objects.order_by("-started_at", "-id"))
        )
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(ns.DeliverySerializer(page, many=True).data)

    @action(
        detail=True,
        methods=["post"],
        url_path=r"deliveries/(?P<delivery>[^/.]+)/redeliver",
    )
    def redeliver(self, request, pk=None, delivery=None):
        """Sends the same event (same id) again now."""
        webhook = self.get_object()
        if not (str(delivery).isascii() and str(delivery).isdigit()) or int(delivery) > 2**63 - 1:
            raise NotFound(f"No delivery {delivery!r}.")
        found = selectors.delivery_get(self.actor, webhook, int(delivery))
        return Response(
            ns.DeliverySerializer(delivery_redeliver(actor=self.actor, delivery=found)).data
        )


@extend_schema_view(
    create=extend_schema(
        request=ns.ChatChannelCreateSerializer, responses={201: ns.ChatChannelSerializer}
    ),
    partial_update=extend_schema(request=ns.ChatChannelUpdateSerializer),
    deliveries=extend_schema(responses=ns.DeliverySerializer(many=True)),
    redeliver=extend_schema(
        request=None,
        responses=ns.DeliverySerializer,
        parameters=[OpenApiParameter("delivery", OpenApiTypes.INT, OpenApiParameter.PATH)],
    ),
)
class ChatChannelViewSet(WebhookViewSet):
    """Chat channels (Slack- or Teams-compatible incoming webhooks) of the
    departments you approve in; deliveries, retries and the log are the webhooks'."""

    serializer_class = ns.ChatChannelSerializer

    def get_queryset(self):
        if schema_only(self):
            return Webhook.objects.none()
        _person_only(self.actor)
        return selectors.webhooks_for(self.actor, selectors.CHAT)

    def get_object(self):
        _person_only(self.actor)
        return selectors.webhook_get(self.actor, self.lookup_id(), selectors.CHAT)

    def create(self, request):
        """Approvers of the department; the URL is never shown again."""
        data = ns.ChatChannelCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = _department(values.pop("department"))
        channel = chat_channel_create(actor=self.actor, department=department, **values)
        return Response(ns.ChatChannelSerializer(channel).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        data = ns.ChatChannelUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        channel = chat_channel_update(
            actor=self.actor, channel=self.get_object(), **data.validated_data
        )
        return Response(ns.ChatChannelSerializer(channel).data)

    def destroy(self, request, pk=None):
        chat_channel_delete(actor=self.actor, channel=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
