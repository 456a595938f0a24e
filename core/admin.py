"""Admin for departments, people, tokens and the audit log. Everything
security-relevant is read-only here: changes go through the services, which
audit them."""

from __future__ import annotations

from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin
from core.models import ApiToken, AuditEvent, Department, Membership


class MembershipInline(ReadOnlyAdminMixin, admin.TabularInline):
    """Membership changes are security-relevant and audited by services;
    the admin shows them, edits go through the API."""

    model = Membership
    extra = 0


@admin.register(Department)
class DepartmentAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["user", "department", "role", "created_at"]
    list_filter = ["department", "role"]
    search_fields = ["user__username"]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["name", "prefix", "department", "created_by", "expires_at", "revoked_at"]
    list_filter = ["department"]
    exclude = ["secret_sha256"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "actor_label", "action", "object_repr", "from_state", "to_state"]
    list_filter = ["action", "department"]
    search_fields = ["object_repr", "actor_label", "request_id"]
    date_hierarchy = "created_at"

    def get_actions(self, request):
        # Removes the built-in "delete selected" action.
        return {}
