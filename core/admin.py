"""Admin for departments, people, tokens and the audit log. Every change goes
through the services, which check and audit it; tokens and the audit log are
read-only here."""

from __future__ import annotations

from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin, ServiceAdminMixin
from core.models import ApiToken, AuditEvent, Department, Membership
from core.services.departments import (
    department_create,
    department_update,
    membership_remove,
    membership_set,
)


class MembershipInline(ReadOnlyAdminMixin, admin.TabularInline):
    """Shown on the department; changed on the Memberships screen (audited)."""

    model = Membership
    extra = 0


@admin.register(Department)
class DepartmentAdmin(ServiceAdminMixin, admin.ModelAdmin):
    list_display = ["slug", "name", "artifact_retention_days", "created_at"]
    search_fields = ["slug", "name"]
    fields = ["slug", "name", "artifact_retention_days"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # The slug is identity: storage prefixes and URLs are built from it.
        return ["slug"] if obj is not None else []

    def has_delete_permission(self, request, obj=None):
        # Adapters, tokens and the audit log refer to departments.
        return False

    def service_save(self, actor, obj, form, change):
        retention = form.cleaned_data.get("artifact_retention_days")
        if change:
            return department_update(
                actor=actor,
                department=obj,
                name=form.cleaned_data["name"],
                artifact_retention_days=retention,
            )
        department = department_create(
            actor=actor, slug=form.cleaned_data["slug"], name=form.cleaned_data["name"]
        )
        if retention is not None:
            department = department_update(
                actor=actor, department=department, artifact_retention_days=retention
            )
        return department


@admin.register(Membership)
class MembershipAdmin(ServiceAdminMixin, admin.ModelAdmin):
    list_display = ["user", "department", "role", "created_at"]
    list_filter = ["department", "role"]
    search_fields = ["user__username"]
    fields = ["user", "department", "role"]

    def get_readonly_fields(self, request, obj=None):
        return ["user", "department"] if obj is not None else []

    def service_save(self, actor, obj, form, change):
        return membership_set(
            actor=actor,
            department=obj.department,
            username=obj.user.get_username(),
            role=form.cleaned_data["role"],
        )

    def service_delete(self, actor, obj):
        membership_remove(actor=actor, membership=obj)


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
