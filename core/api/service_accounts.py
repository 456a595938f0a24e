"""/api/v1/service-accounts/: pipelines that are not people (core.services.service_accounts)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter

from core.api.views import ActorMixin, schema_only
from core.errors import NotFound
from core.models import Ability, ApiToken, Department, ServiceAccount
from core.service_account_selectors import service_account_get, service_accounts_for
from core.services.service_accounts import (
    service_account_create,
    service_account_deactivate,
    service_account_token_create,
)


class ServiceAccountSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    deactivated_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ServiceAccount
        fields = [
            "id",
            "department",
            "name",
            "description",
            "username",
            "active",
            "created_by",
            "created_at",
            "deactivated_at",
            "deactivated_by",
        ]


class ServiceAccountCreateSerializer(serializers.Serializer):
    department = serializers.SlugField()
    # The service's rule (core/services/service_accounts.py), stated in the schema.
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9-]{0,62}$", max_length=63)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)


class ServiceAccountTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    # min_length states allow_empty=False in the schema (minItems: 1).
    abilities = serializers.ListField(
        child=serializers.ChoiceField(choices=Ability.choices), allow_empty=False, min_length=1
    )
    expires_in_days = serializers.IntegerField(required=False, min_value=1)

    def get_fields(self):
        # The bound is a setting; the schema states it (the token service enforces it).
        fields = super().get_fields()
        fields["expires_in_days"].max_value = settings.API_TOKEN_MAX_DAYS
        return fields


class ServiceAccountTokenSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    secret = serializers.CharField(read_only=True, help_text="Shown once. Store it now.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "abilities", "created_by", "created_at", "expires_at"]
        fields += ["secret"]


@extend_schema_view(
    create=extend_schema(
        request=ServiceAccountCreateSerializer, responses={201: ServiceAccountSerializer}
    ),
    tokens=extend_schema(
        request=ServiceAccountTokenCreateSerializer,
        responses={201: ServiceAccountTokenSerializer},
    ),
    deactivate=extend_schema(request=None, responses=ServiceAccountSerializer),
)
class ServiceAccountViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = ServiceAccountSerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = ServiceAccount.objects.none()
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        if schema_only(self):
            return ServiceAccount.objects.none()
        return service_accounts_for(self.actor)

    def get_object(self):
        return service_account_get(self.actor, self.lookup_id())

    def create(self, request):
        data = ServiceAccountCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = Department.objects.filter(slug=values.pop("department")).first()
        if department is None:
            raise NotFound("Department not found.")
        account = service_account_create(actor=self.actor, department=department, **values)
        return Response(ServiceAccountSerializer(account).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def tokens(self, request, pk=None):
        data = ServiceAccountTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = service_account_token_create(
            actor=self.actor, account=self.get_object(), **data.validated_data
        )
        body = ServiceAccountTokenSerializer(token).data
        body["secret"] = secret
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def deactivate(self, request, pk=None):
        account = service_account_deactivate(actor=self.actor, account=self.get_object())
        return Response(ServiceAccountSerializer(account).data)


router = DefaultRouter()
router.register("service-accounts", ServiceAccountViewSet, basename="service-account")
urlpatterns = router.urls
