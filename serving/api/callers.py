"""/api/v1/inference-keys/, /api/v1/grants/, /api/v1/adapters/{id}/callers/ and
/api/v1/departments/{slug}/limits/: who may call what at the front doors, and
how much (docs/operators/keys-and-grants.md, docs/door.md "Limits").

Reads go through serving.caller_selectors (outsiders get 404), writes through
one service each (serving/services/inference_keys.py, grants.py)."""

from __future__ import annotations

import django_filters
from django.conf import settings
from django.db.models import Exists, OuterRef
from django.urls import path
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter
from rest_framework.views import APIView

from core import selectors as core_selectors
from core.api.filters import StrictFilterSet
from core.api.views import ActorMixin, schema_only
from core.errors import ReferenceNotFound
from core.models import Department
from registry import selectors as registry_selectors
from serving import caller_selectors
from serving.door.selectors import live_inference_keys
from serving.models import AdapterGrant, InferenceKey
from serving.quota_selectors import department_budgets, department_limits_of
from serving.services.grants import grant_decide, grant_request, grant_revoke
from serving.services.inference_keys import HOLDERS, inference_key_issue, inference_key_revoke
from serving.services.limits import (
    MAXIMUM,
    department_limits_set,
    inference_key_limits_set,
)

KEY_STATUSES = ["active", "suspended", "expired", "revoked"]


def _department(slug: str) -> Department:
    department = Department.objects.filter(slug=slug).first()
    if department is None:
        raise ReferenceNotFound(f"No department {slug!r}.", code="department_not_found")
    return department


# --- Inference keys -----------------------------------------------------------


class InferenceKeySerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    holder = serializers.ChoiceField(choices=HOLDERS, source="holder_kind", read_only=True)
    service_account = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    person = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    revoked_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    status = serializers.SerializerMethodField(
        help_text="active: the door takes it; suspended: its person left the department or "
        "was deactivated, or its service account was; expired; revoked."
    )

    class Meta:
        model = InferenceKey
        fields = [
            "id",
            "name",
            "prefix",
            "department",
            "holder",
            "service_account",
            "person",
            "status",
            "created_by",
            "created_at",
            "expires_at",
            "revoked_at",
            "revoked_by",
            "revoked_reason",
            "requests_per_minute",
            "tokens_per_minute",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "requests_per_minute": {
                "help_text": "The key's own limit at each front door; null: its "
                "department's alone. Never above the department's."
            },
            "tokens_per_minute": {
                "help_text": "Prompt plus completion tokens a minute (UTC), metered; null: "
                "its department's alone."
            },
        }

    def get_status(self, key) -> str:
        return caller_selectors.key_status(key)


class InferenceKeyCreatedSerializer(InferenceKeySerializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="Shown once, never again: send it as `Authorization: Bearer <secret>`.",
    )

    class Meta(InferenceKeySerializer.Meta):
        fields = [*InferenceKeySerializer.Meta.fields, "secret"]
        read_only_fields = fields


class InferenceKeyCreateSerializer(serializers.Serializer):
    department = serializers.SlugField(help_text="The department the key calls as.")
    name = serializers.CharField(max_length=100)
    holder = serializers.ChoiceField(
        choices=HOLDERS,
        default="department",
        help_text="department (its approvers issue it), service_account (name it), or "
        "person: a key of your own.",
    )
    service_account = serializers.SlugField(
        required=False, help_text="The service account's name, with holder service_account."
    )
    expires_in_days = serializers.IntegerField(min_value=1)

    def get_fields(self):
        # The bound is a setting; the schema states it (the service enforces it).
        fields = super().get_fields()
        fields["expires_in_days"].max_value = settings.SERVING_INFERENCE_KEY_MAX_DAYS
        return fields


def _limit_field(name: str, help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1,
        max_value=MAXIMUM[name],
        allow_null=True,
        required=False,
        help_text=help_text + " null: no limit. Left out: unchanged.",
    )


class KeyLimitsSerializer(serializers.Serializer):
    requests_per_minute = _limit_field(
        "requests_per_minute",
        "Requests a minute (UTC calendar minute) at each front door, at most the "
        "department's; over it the door answers 429.",
    )
    tokens_per_minute = _limit_field(
        "tokens_per_minute",
        "Prompt plus completion tokens a minute, at most the department's; enforced "
        "from metered usage within one reconcile tick.",
    )


class RevokeSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class InferenceKeyFilter(StrictFilterSet):
    department = django_filters.CharFilter(field_name="department__slug")
    status = django_filters.ChoiceFilter(choices=[(s, s) for s in KEY_STATUSES], method="by_status")

    class Meta:
        model = InferenceKey
        fields = ["department", "status"]

    def by_status(self, queryset, name, value):
        now = timezone.now()
        if value == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if value == "expired":
            return queryset.filter(revoked_at__isnull=True, expires_at__lte=now)
        live = Exists(live_inference_keys(now).filter(pk=OuterRef("pk")))
        queryset = queryset.filter(revoked_at__isnull=True, expires_at__gt=now)
        return queryset.filter(live) if value == "active" else queryset.exclude(live)


@extend_schema_view(
    create=extend_schema(
        request=InferenceKeyCreateSerializer, responses={201: InferenceKeyCreatedSerializer}
    ),
    revoke=extend_schema(request=RevokeSerializer, responses=InferenceKeySerializer),
    limits=extend_schema(
        request=KeyLimitsSerializer,
        responses=InferenceKeySerializer,
        description="Sets the key's own limits (approvers of its department and platform "
        "admins): never above its department's (400 `above_department_limit`). In effect "
        "at every front door within seconds, without a reload.",
    ),
)
class InferenceKeyViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Keys for the front doors. People only: a token gets 403."""

    serializer_class = InferenceKeySerializer
    # For the schema generator only; rows always come from the selectors.
    queryset = InferenceKey.objects.none()
    filterset_class = InferenceKeyFilter
    ordering_fields = ["created_at", "expires_at", "name"]

    def get_queryset(self):
        if schema_only(self):
            return InferenceKey.objects.none()
        return caller_selectors.inference_keys_for(self.actor)

    def get_object(self):
        return caller_selectors.inference_key_get(self.actor, self.lookup_id())

    def create(self, request):
        data = InferenceKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        department = _department(values.pop("department"))
        account_name = values.pop("service_account", None)
        account = None
        if account_name is not None:
            account = department.service_accounts.filter(name=account_name).first()
            if account is None:
                raise ReferenceNotFound(
                    f"{department.slug} has no service account {account_name!r}.",
                    code="service_account_not_found",
                )
        key, secret = inference_key_issue(
            actor=self.actor, department=department, service_account=account, **values
        )
        body = InferenceKeyCreatedSerializer(key).data
        body["secret"] = secret
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        data = RevokeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = inference_key_revoke(
            actor=self.actor, key=self.get_object(), reason=data.validated_data["reason"]
        )
        return Response(
            InferenceKeySerializer(caller_selectors.inference_key_get(self.actor, key.pk)).data
        )

    @action(detail=True, methods=["patch"])
    def limits(self, request, pk=None):
        data = KeyLimitsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = inference_key_limits_set(
            actor=self.actor, key=self.get_object(), changes=dict(data.validated_data)
        )
        return Response(
            InferenceKeySerializer(caller_selectors.inference_key_get(self.actor, key.pk)).data
        )


# --- Department limits --------------------------------------------------------


class DepartmentLimitsSerializer(serializers.Serializer):
    requests_per_minute = _limit_field(
        "requests_per_minute",
        "Requests a minute (UTC calendar minute) from all the department's keys, "
        "counted by each front door; over it the door answers 429.",
    )
    tokens_per_minute = _limit_field(
        "tokens_per_minute",
        "Prompt plus completion tokens a minute from all its keys, metered across the "
        "front doors; enforced within one reconcile tick of being crossed.",
    )
    tokens_per_day = _limit_field(
        "tokens_per_day",
        "Token budget per UTC day; once spent, the doors answer 429 `insufficient_quota` "
        "until midnight UTC.",
    )
    tokens_per_month = _limit_field(
        "tokens_per_month",
        "Token budget per UTC calendar month; at least tokens_per_day.",
    )


class BudgetSerializer(serializers.Serializer):
    limit = serializers.ChoiceField(
        choices=["tokens_per_minute", "tokens_per_day", "tokens_per_month"]
    )
    value = serializers.IntegerField(help_text="The limit, in tokens.")
    used = serializers.IntegerField(
        allow_null=True, help_text="Metered so far in this window; null: nothing meters tokens."
    )
    left = serializers.IntegerField(allow_null=True, help_text="value - used, at least 0.")
    resets_at = serializers.DateTimeField(help_text="When the window ends (UTC).")


class DepartmentLimitsReadSerializer(DepartmentLimitsSerializer):
    department = serializers.SlugField()
    budgets = BudgetSerializer(
        many=True, help_text="What is left of each token limit now, where one is set."
    )


class DepartmentLimitsView(ActorMixin, APIView):
    def _body(self, department) -> dict:
        limits = department_limits_of(department)
        return DepartmentLimitsReadSerializer(
            {
                "department": department.slug,
                **{
                    name: getattr(limits, name)
                    for name in list(DepartmentLimitsSerializer().fields)
                },
                "budgets": department_budgets(department.slug, limits),
            }
        ).data

    @extend_schema(
        responses=DepartmentLimitsReadSerializer,
        description="The department's limits at the front doors and what is left of its "
        "token budgets. Its members and platform admins; others get 404.",
    )
    def get(self, request, slug: str):
        return Response(self._body(core_selectors.department_get(self.actor, slug)))

    @extend_schema(
        request=DepartmentLimitsSerializer,
        responses=DepartmentLimitsReadSerializer,
        description="Sets the named limits (platform admins only; audited). In effect at "
        "every front door within seconds, without a reload.",
    )
    def patch(self, request, slug: str):
        department = core_selectors.department_get(self.actor, slug)
        data = DepartmentLimitsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        department_limits_set(
            actor=self.actor, department=department, changes=dict(data.validated_data)
        )
        return Response(self._body(department))


# --- Grants -------------------------------------------------------------------


class GrantSerializer(serializers.ModelSerializer):
    served_name = serializers.CharField(read_only=True, help_text="The adapter it lets call.")
    adapter_department = serializers.SerializerMethodField(
        help_text="The adapter's department, once it decided; before, only its own people see it."
    )
    department = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, help_text="The calling department."
    )
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    decided_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    ended_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = AdapterGrant
        fields = [
            "id",
            "served_name",
            "adapter_department",
            "department",
            "status",
            "reason",
            "expires_at",
            "requested_by",
            "created_at",
            "decided_by",
            "decided_at",
            "comment",
            "ended_by",
            "ended_at",
        ]
        read_only_fields = fields

    def get_adapter_department(self, grant: AdapterGrant) -> str | None:
        shown = caller_selectors.adapter_department_shown(self.context["actor"], grant)
        return shown.slug if shown is not None else None


class GrantRequestSerializer(serializers.Serializer):
    served_name = serializers.CharField(
        max_length=128, help_text="The adapter's served name (its department tells you)."
    )
    department = serializers.SlugField(help_text="The calling department: yours.")
    reason = serializers.CharField(max_length=2000)
    expires_in_days = serializers.IntegerField(min_value=1)

    def get_fields(self):
        fields = super().get_fields()
        fields["expires_in_days"].max_value = settings.SERVING_GRANT_MAX_DAYS
        return fields


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class RefusalSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=2000)


class GrantFilter(StrictFilterSet):
    served_name = django_filters.CharFilter(field_name="served_name")
    department = django_filters.CharFilter(field_name="department__slug")

    class Meta:
        model = AdapterGrant
        fields = ["served_name", "department", "status"]


@extend_schema_view(
    create=extend_schema(request=GrantRequestSerializer, responses={201: GrantSerializer}),
    approve=extend_schema(request=DecisionSerializer, responses=GrantSerializer),
    refuse=extend_schema(request=RefusalSerializer, responses=GrantSerializer),
    revoke=extend_schema(request=DecisionSerializer, responses=GrantSerializer),
)
class GrantViewSet(
    ActorMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Grants to call another department's adapter. Both sides see them."""

    serializer_class = GrantSerializer
    queryset = AdapterGrant.objects.none()
    filterset_class = GrantFilter
    ordering_fields = ["created_at", "expires_at"]

    def get_queryset(self):
        if schema_only(self):
            return AdapterGrant.objects.none()
        return caller_selectors.grants_for(self.actor)

    def get_object(self):
        return caller_selectors.grant_get(self.actor, self.lookup_id())

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "actor": self.actor}

    def create(self, request):
        """Asked by a member of the calling department."""
        data = GrantRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        grant = grant_request(
            actor=self.actor,
            department=_department(values["department"]),
            served_name=values["served_name"],
            expires_in_days=values["expires_in_days"],
            reason=values["reason"],
        )
        return Response(
            GrantSerializer(grant, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED,
        )

    def _decide(self, request, serializer, approve: bool) -> Response:
        data = serializer(data=request.data)
        data.is_valid(raise_exception=True)
        grant = grant_decide(
            actor=self.actor,
            grant=self.get_object(),
            approve=approve,
            comment=data.validated_data["comment"],
        )
        return Response(GrantSerializer(grant, context=self.get_serializer_context()).data)

    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Four eyes: an approver of the adapter's department who did not ask."""
        return self._decide(request, DecisionSerializer, approve=True)

    @action(detail=True, methods=["post"])
    def refuse(self, request, pk=None):
        """As approve; a comment is required."""
        return self._decide(request, RefusalSerializer, approve=False)

    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """An approver of either department."""
        data = DecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        grant = grant_revoke(
            actor=self.actor, grant=self.get_object(), comment=data.validated_data["comment"]
        )
        return Response(GrantSerializer(grant, context=self.get_serializer_context()).data)


# --- Who may call an adapter --------------------------------------------------


class CallerSerializer(serializers.Serializer):
    department = serializers.SlugField()
    why = serializers.ChoiceField(
        choices=["own", "grant"], help_text="own: the adapter's department; grant: grant #n."
    )
    grant = serializers.IntegerField(allow_null=True)
    approved_by = serializers.CharField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    deployments = serializers.ListField(
        child=serializers.CharField(), help_text="Where its keys may call the adapter."
    )


class AdapterCallersView(ActorMixin, APIView):
    @extend_schema(
        responses=CallerSerializer(many=True),
        description="Which departments' keys may call the adapter at the front doors, and why.",
    )
    def get(self, request, pk: int):
        adapter = registry_selectors.adapter_get(self.actor, self.lookup_id())
        return Response(CallerSerializer(caller_selectors.adapter_callers(adapter), many=True).data)


router = DefaultRouter()
router.register("inference-keys", InferenceKeyViewSet, basename="inference-key")
router.register("grants", GrantViewSet, basename="grant")
urlpatterns = [
    *router.urls,
    path("adapters/<int:pk>/callers/", AdapterCallersView.as_view(), name="adapter-callers"),
    path(
        "departments/<slug:slug>/limits/",
        DepartmentLimitsView.as_view(),
        name="department-limits",
    ),
]
