"""Admin for departments, people, tokens and the audit log. Every change goes
through the services, which check and audit it; tokens and the audit log are
read-only here."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from core.admin_mixins import ReadOnlyAdminMixin, ServiceAdminMixin
from core.errors import ApplicationError
from core.models import ApiToken, AuditEvent, Department, Membership, ServiceAccount
from core.service_account_selectors import describe_minted, tokens_minted_by
from core.services.departments import (
    department_create,
    department_update,
    membership_remove,
    membership_set,
)
from core.services.service_accounts import (
    minted_tokens_revoke,
    service_account_create,
    service_account_deactivate,
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


@admin.register(ServiceAccount)
class ServiceAccountAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """Created here or by the department's approvers (API); tokens are minted
    through the API, where the secret is shown once."""

    list_display = ["name", "department", "created_by", "created_at", "deactivated_at"]
    list_filter = ["department"]
    fields = ["department", "name", "description"]
    actions = ["deactivate"]

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False  # deactivated, never deleted: the audit log names it

    def service_save(self, actor, obj, form, change):
        return service_account_create(
            actor=actor,
            department=form.cleaned_data["department"],
            name=form.cleaned_data["name"],
            description=form.cleaned_data["description"],
        )

    @admin.action(description="Deactivate (ends every token at once)")
    def deactivate(self, request, queryset):
        from core.actors import actor_from_request

        for account in queryset:
            try:
                service_account_deactivate(actor=actor_from_request(request), account=account)
            except ApplicationError as error:
                self.message_user(request, f"{account}: {error.message}", messages.ERROR)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "department",
        "service_account",
        "created_by",
        "expires_at",
        "revoked_at",
    ]
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


# --- People and groups: Django's screens, every change audited ----------------
# Granting is_staff makes a platform admin; is_active decides who may sign in; a
# second account could pass four-eyes. Django's own admin logs none of it in the
# audit chain, so its User and Group screens are replaced by these.


class PersonAdmin(UserAdmin):
    actions = ["revoke_minted_tokens"]
    readonly_fields = [*UserAdmin.readonly_fields, "minted_service_tokens"]

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        return [*fieldsets, ("Pipeline tokens", {"fields": ["minted_service_tokens"]})]

    @admin.display(description="Service-account tokens this person minted (still working)")
    def minted_service_tokens(self, obj):
        tokens = describe_minted(tokens_minted_by(obj))
        if not tokens:
            return "none"
        return "; ".join(f"{t['service_account']}: {t['name']} ({t['prefix']}…)" for t in tokens)

    @admin.action(description="Revoke the service-account tokens they minted (leavers)")
    def revoke_minted_tokens(self, request, queryset):
        from core.actors import actor_from_request

        for person in queryset:
            try:
                ended = minted_tokens_revoke(actor=actor_from_request(request), user=person)
            except ApplicationError as error:
                self.message_user(request, f"{person}: {error.message}", messages.ERROR)
                continue
            self.message_user(
                request, f"{person}: {len(ended)} service-account token(s) revoked.", messages.INFO
            )

    def save_model(self, request, obj, form, change):
        from core.actors import actor_from_request
        from core.services.people import user_saved, user_snapshot

        before = user_snapshot(obj)
        super().save_model(request, obj, form, change)
        extra = {"password_set": True} if not change and obj.has_usable_password() else None
        user_saved(
            actor=actor_from_request(request), user=obj, before=before, via="admin", extra=extra
        )
        if before and before["is_active"] and not obj.is_active:
            self._offer_minted_tokens(request, obj)

    def _offer_minted_tokens(self, request, person):
        """Offboarding: the pipeline tokens this leaver minted still work (their
        departments own them) unless the policy ended them; say which, and how to
        end them."""
        kept = describe_minted(tokens_minted_by(person))
        if not kept:
            return
        names = ", ".join(f"{t['service_account']} ({t['prefix']}…)" for t in kept)
        self.message_user(
            request,
            f"Service-account tokens {person} minted still work: {names}. "
            "Revoke them with the action 'Revoke the service-account tokens they minted', "
            "or set OFFBOARDING_REVOKE_SERVICE_TOKENS to do it at every offboarding.",
            messages.WARNING,
        )

    def save_related(self, request, form, formsets, change):
        from core.actors import actor_from_request
        from core.services.people import user_groups_changed

        user = form.instance
        before = set(user.groups.values_list("name", flat=True)) if change else set()
        super().save_related(request, form, formsets, change)
        after = set(user.groups.values_list("name", flat=True))
        user_groups_changed(
            actor=actor_from_request(request), user=user, before=before, after=after, via="admin"
        )

    def user_change_password(self, request, id, form_url=""):
        from core.actors import actor_from_request
        from core.services.people import user_password_changed

        before = get_user_model().objects.filter(pk=id).values_list("password", flat=True).first()
        response = super().user_change_password(request, id, form_url)
        user = get_user_model().objects.filter(pk=id).first()
        if user is not None and before is not None and user.password != before:
            user_password_changed(actor=actor_from_request(request), user=user, via="admin")
        return response

    def has_delete_permission(self, request, obj=None):
        # The audit log names people (on_delete=PROTECT): deactivate instead.
        return False


class AuditedGroupAdmin(GroupAdmin):
    def save_model(self, request, obj, form, change):
        from core.services.people import group_snapshot

        request._group_before = group_snapshot(obj)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        from core.actors import actor_from_request
        from core.services.people import group_saved

        super().save_related(request, form, formsets, change)
        group_saved(
            actor=actor_from_request(request),
            group=form.instance,
            before=getattr(request, "_group_before", None),
            via="admin",
        )

    def delete_model(self, request, obj):
        from core.actors import actor_from_request
        from core.audit import audit_record

        audit_record(
            actor=actor_from_request(request),
            action="group.deleted",
            obj=obj,
            department=None,
            details={"name": obj.name},
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for group in queryset:
            self.delete_model(request, group)


for _model in (get_user_model(), Group):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
admin.site.register(get_user_model(), PersonAdmin)
admin.site.register(Group, AuditedGroupAdmin)
