"""What every API view of the product stands on (ActorMixin), and core's own
API: departments and their memberships, the audit feed and tokens (the probes are core.health)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core import selectors
from core.access import require_token_ability
from core.actors import Actor, actor_from_request
from core.api import serializers as cs
from core.api.filters import AuditEventFilter
from core.errors import NotFound
from core.models import Ability, ApiToken, AuditEvent, Department
from core.services.departments import department_create, membership_remove, membership_set
from core.services.tokens import token_create, token_revoke


def schema_only(view) -> bool:
    """True while drf-spectacular builds the schema: there is no request, so no
    actor, and a view's queryset is only asked for its model."""
    return getattr(view, "swagger_fake_view", False)


class ActorMixin:
    # Set by the DRF view this is mixed into (Django's View and DRF's APIView
    # type `request` differently, so it is left open here).
    request: Any
    kwargs: dict

    @property
    def actor(self) -> Actor:
        if not hasattr(self, "_actor"):
            self._actor = actor_from_request(self.request)
        return self._actor

    def lookup_id(self) -> int:
        """The numeric id in the URL; anything else names no object (404, not 500)."""
        raw = self.kwargs["pk"]
        # Digits only, and within a database integer: a larger one overflowed into a 500.
        if not (str(raw).isascii() and str(raw).isdigit()) or int(raw) > 2**63 - 1:
            raise NotFound(f"No object with id {raw!r}.")
        return int(raw)


class DepartmentViewSet(ActorMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = cs.DepartmentSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = Department.objects.none()
    lookup_field = "slug"
    ordering_fields = ["slug", "name"]

    def get_queryset(self):
        if schema_only(self):
            return Department.objects.none()
        return selectors.departments_for(self.actor)

    def get_object(self):
        return selectors.department_get(self.actor, self.kwargs["slug"])

    @extend_schema(request=cs.DepartmentSerializer, responses={201: cs.DepartmentSerializer})
    def create(self, request):
        data = cs.DepartmentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        department = department_create(actor=self.actor, **data.validated_data)
        return Response(cs.DepartmentSerializer(department).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=cs.MembershipSerializer(many=True))
    @action(detail=True, methods=["get"])
    def memberships(self, request, slug=None):
        require_token_ability(self.actor, Ability.READ_AUDIT)
        department = self.get_object()
        rows = (
            selectors.memberships_for(self.actor)
            .filter(department=department)
            .order_by("user__username")
        )
        # Paginated like every other list (the schema said so; the body was a bare list).
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(cs.MembershipSerializer(page, many=True).data)

    @extend_schema(request=cs.MembershipInputSerializer, responses=cs.MembershipSerializer)
    @memberships.mapping.post
    def set_membership(self, request, slug=None):
        department = self.get_object()
        data = cs.MembershipInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = membership_set(actor=self.actor, department=department, **data.validated_data)
        return Response(cs.MembershipSerializer(membership).data, status=status.HTTP_200_OK)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"memberships/(?P<username>[^/]+)")
    def remove_membership(self, request, slug=None, username=None):
        department = self.get_object()
        membership = (
            selectors.memberships_for(self.actor)
            .filter(department=department, user__username=username)
            .first()
        )
        if membership is None:
            raise NotFound("Membership not found.")
        membership_remove(actor=self.actor, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEventViewSet(ActorMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = cs.AuditEventSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = AuditEvent.objects.none()
    filterset_class = AuditEventFilter
    ordering_fields = ["created_at", "action"]

    def get_queryset(self):
        if schema_only(self):
            return AuditEvent.objects.none()
        require_token_ability(self.actor, Ability.READ_AUDIT)
        return selectors.audit_events_for(self.actor)


@extend_schema_view(
    create=extend_schema(
        request=cs.TokenCreateSerializer, responses={201: cs.TokenCreatedSerializer}
    ),
    revoke=extend_schema(request=None, responses=cs.TokenSerializer),
)
class TokenViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = cs.TokenSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = ApiToken.objects.none()
    ordering_fields = ["created_at", "expires_at"]

    def get_queryset(self):
        if schema_only(self):
            return ApiToken.objects.none()
        return selectors.tokens_for(self.actor)

    def get_object(self):
        return selectors.token_get(self.actor, self.lookup_id())

    def create(self, request):
        data = cs.TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = selectors.department_get(self.actor, values.pop("department"))
        token, secret = token_create(actor=self.actor, department=department, **values)
        body = cs.TokenSerializer(token).data
        body["secret"] = secret
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = token_revoke(actor=self.actor, token=self.get_object())
        return Response(cs.TokenSerializer(token).data)
