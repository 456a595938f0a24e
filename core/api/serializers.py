"""Shapes of core's API payloads (departments, memberships, audit events, tokens)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from core.models import Ability, ApiToken, AuditEvent, Department, Membership, Role


class DepartmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Department
        fields = ["id", "slug", "name", "created_at"]
        # A taken slug is department_create's 409 (a conflict), not a 400.
        extra_kwargs = {"slug": {"validators": []}}


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "department", "role", "created_at"]


class MembershipInputSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class AuditEventSerializer(serializers.ModelSerializer):
    # null for platform-wide events (a deployment changed, a department created).
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    actor = serializers.CharField(source="actor_label", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor",
            "action",
            "department",
            "object_type",
            "object_id",
            "object_repr",
            "from_state",
            "to_state",
            "comment",
            "request_id",
            "client_address",
            "details",
        ]


class TokenSerializer(serializers.ModelSerializer):
    department = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    service_account = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="department/name when the token acts as a service account, else null",
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "department",
            "service_account",
            "abilities",
            "created_by",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
        ]


class TokenCreateSerializer(serializers.Serializer):
    department = serializers.SlugField()
    name = serializers.CharField(max_length=100)
    abilities = serializers.ListField(
        child=serializers.ChoiceField(choices=Ability.choices), allow_empty=False, min_length=1
    )
    expires_in_days = serializers.IntegerField(required=False, min_value=1)

    def get_fields(self):
        # The bound is a setting; the schema states it (token_create enforces it).
        fields = super().get_fields()
        fields["expires_in_days"].max_value = settings.API_TOKEN_MAX_DAYS
        return fields


class TokenCreatedSerializer(TokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once. Store it now.")

    class Meta(TokenSerializer.Meta):
        fields = TokenSerializer.Meta.fields + ["secret"]
