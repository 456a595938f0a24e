"""Admin screens for the control plane. Rollout history, attempts and drift are
read-only records; the vLLM API key is never shown."""

from django import forms
from django.contrib import admin, messages

from core.actors import actor_from_request
from core.admin_mixins import ReadOnlyAdminMixin
from core.errors import ApplicationError
from serving.models import (
    LIMIT_FIELDS,
    AdapterGrant,
    Canary,
    DepartmentLimits,
    Deployment,
    DriftEvent,
    HttpAttempt,
    InferenceKey,
    Promotion,
    Replica,
    ReplicaRollout,
    Rollout,
    ServedAdapter,
    StagedFolder,
    VersionFingerprint,
)
from serving.services.deployments import deployment_delete
from serving.services.limits import department_limits_set, limits_checked


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    fields = (
        "base_url",
        "active",
        "health",
        "vllm_version",
        "last_seen_at",
        "in_sync_polls",
        "in_sync_since",
        "last_error",
    )
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: creating and changing a deployment goes through the API, which
    validates and audits it. Deleting is an action that calls the same service."""

    list_display = ["name", "environment", "base_model_name", "max_cpu_loras", "last_reconciled_at"]
    list_filter = ["environment"]
    exclude = ["vllm_api_key", "reconcile_lease_owner", "reconcile_lease_until"]
    inlines = [ReplicaInline]
    actions = ["delete_through_service"]

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    @admin.action(description="Delete selected deployments (refused while they serve adapters)")
    def delete_through_service(self, request, queryset):
        actor = actor_from_request(request)
        for deployment in queryset:
            try:
                deployment_delete(actor=actor, deployment=deployment)
            except ApplicationError as error:
                self.message_user(request, f"{deployment}: {error.message}", messages.ERROR)
            else:
                self.message_user(request, f"Deleted {deployment}.", messages.SUCCESS)


@admin.register(ServedAdapter)
class ServedAdapterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["deployment", "adapter", "version", "served_path", "updated_at"]
    list_filter = ["deployment"]
    list_select_related = ["deployment", "adapter__department", "version__adapter__department"]


@admin.register(Promotion)
class PromotionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["version", "deployment", "status", "requested_by", "reviewed_by", "created_at"]
    list_filter = ["status", "deployment"]
    list_select_related = [
        "version__adapter__department",
        "deployment",
        "requested_by",
        "reviewed_by",
    ]


class ReplicaRolloutInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ReplicaRollout
    extra = 0
    readonly_fields = ["replica", "status", "error", "updated_at"]


class CanaryInline(ReadOnlyAdminMixin, admin.StackedInline):
    model = Canary
    fk_name = "rollout"
    extra = 0
    readonly_fields = [
        "state",
        "share",
        "bake_seconds",
        "replica",
        "bake_until",
        "decided_by",
        "decided_at",
    ]


@admin.register(Rollout)
class RolloutAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "deployment", "adapter", "kind", "status", "target_version", "created_at"]
    list_filter = ["status", "kind", "deployment"]
    list_select_related = [
        "deployment",
        "adapter__department",
        "target_version__adapter__department",
    ]
    inlines = [CanaryInline, ReplicaRolloutInline]


@admin.register(HttpAttempt)
class HttpAttemptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "started_at",
        "replica",
        "purpose",
        "method",
        "status_code",
        "ok",
        "duration_ms",
    ]
    list_filter = ["purpose", "ok", "transient"]
    list_select_related = ["replica"]


@admin.register(DriftEvent)
class DriftEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "last_seen_at",
        "created_at",
        "count",
        "deployment",
        "replica",
        "kind",
        "adapter_name",
    ]
    list_filter = ["kind", "deployment"]
    list_select_related = ["deployment", "replica"]


@admin.register(StagedFolder)
class StagedFolderAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "write_path",
        "deployment",
        "created_at",
        "verified_at",
        "unreferenced_since",
        "deleted_at",
    ]
    list_select_related = ["deployment"]


@admin.register(VersionFingerprint)
class VersionFingerprintAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Recorded by verification only: a hand-edited fingerprint would fail every
    replica, or pass wrong weights."""

    list_display = ["version", "deployment", "recorded_from_url", "rollout", "created_at"]
    list_filter = ["deployment"]
    list_select_related = ["version__adapter__department", "deployment", "rollout"]


@admin.register(InferenceKey)
class InferenceKeyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Issued and revoked on the Keys pages and the API (audited), not here."""

    list_display = [
        "prefix",
        "name",
        "department",
        "holder_kind",
        "requests_per_minute",
        "tokens_per_minute",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["department"]
    list_select_related = ["department"]
    exclude = ["secret_sha256"]
    search_fields = ["prefix", "name"]


@admin.register(AdapterGrant)
class AdapterGrantAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Asked, decided and revoked on the adapter's page and the API (audited)."""

    # served_name: a request for a name no adapter has shows no adapter.
    list_display = [
        "pk",
        "served_name",
        "adapter",
        "department",
        "status",
        "expires_at",
        "decided_by",
    ]
    list_filter = ["status", "department"]
    list_select_related = ["adapter__department", "department", "decided_by"]


class DepartmentLimitsForm(forms.ModelForm):
    class Meta:
        model = DepartmentLimits
        fields = ["department", *LIMIT_FIELDS]

    def clean(self):
        cleaned = super().clean()
        try:
            limits_checked({name: cleaned.get(name) for name in LIMIT_FIELDS})
        except ApplicationError as error:
            raise forms.ValidationError(error.message) from error
        return cleaned


@admin.register(DepartmentLimits)
class DepartmentLimitsAdmin(admin.ModelAdmin):
    """Platform admins set a department's limits here or in the API; either way
    through the service, which audits the change and tells every front door."""

    form = DepartmentLimitsForm
    list_display = ["department", *LIMIT_FIELDS, "updated_by", "updated_at"]
    list_select_related = ["department", "updated_by"]

    def get_readonly_fields(self, request, obj=None):
        return ["department"] if obj else []

    def _platform_admin(self, request) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return self._platform_admin(request)

    def has_change_permission(self, request, obj=None):
        return self._platform_admin(request)

    def has_add_permission(self, request):
        return self._platform_admin(request)

    def has_delete_permission(self, request, obj=None):
        return False  # empty every field instead: the change is audited

    def has_module_permission(self, request):
        return self._platform_admin(request)

    def save_model(self, request, obj, form, change):
        saved = department_limits_set(
            actor=actor_from_request(request),
            department=form.cleaned_data.get("department") or obj.department,
            changes={name: form.cleaned_data.get(name) for name in LIMIT_FIELDS},
        )
        obj.pk = saved.pk
