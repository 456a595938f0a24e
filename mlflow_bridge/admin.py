"""Admin screens for the MLflow mirror state: read-only, changed only by the
mirror services (run `manage.py mlflow_resync` to push again)."""

from __future__ import annotations

from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin, ServiceAdminMixin
from mlflow_bridge.experiments import allowed_experiment_create, allowed_experiment_delete
from mlflow_bridge.models import (
    AllowedExperiment,
    MlflowAliasMirror,
    MlflowVersionMirror,
    WebhookDelivery,
    WebhookRefusalCount,
    WebhookRule,
)
from mlflow_bridge.webhooks import RULE_FIELDS, webhook_rule_delete, webhook_rule_save


class _ReadOnly(ReadOnlyAdminMixin, admin.ModelAdmin):
    pass


@admin.register(MlflowVersionMirror)
class MlflowVersionMirrorAdmin(_ReadOnly):
    list_display = [
        "version",
        "state",
        "registered_model",
        "model_version",
        "synced_status",
        "attempts",
        "updated_at",
    ]
    list_filter = ["state"]
    list_select_related = ["version__adapter__department"]
    search_fields = ["registered_model", "last_error"]


@admin.register(MlflowAliasMirror)
class MlflowAliasMirrorAdmin(_ReadOnly):
    list_display = ["alias", "adapter", "version", "state", "attempts", "updated_at"]
    list_filter = ["state"]
    list_select_related = ["adapter__department", "version__adapter__department"]
    search_fields = ["alias", "deployment__name", "last_error"]


@admin.register(WebhookRule)
class WebhookRuleAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """Which MLflow webhook events register versions for a department (audited)."""

    fields = ["department", *RULE_FIELDS]
    list_display = ["department", "event", "alias", "submit", "enabled", "created_by"]
    list_filter = ["event", "enabled", "department"]
    list_select_related = ["department", "created_by"]

    def get_readonly_fields(self, request, obj=None):
        return ["department"] if obj is not None else []

    def service_save(self, actor, obj, form, change):
        values = {name: form.cleaned_data[name] for name in RULE_FIELDS}
        if change:
            return webhook_rule_save(actor=actor, rule=WebhookRule.objects.get(pk=obj.pk), **values)
        return webhook_rule_save(actor=actor, department=obj.department, **values)

    def service_delete(self, actor, obj):
        webhook_rule_delete(actor=actor, rule=obj)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_ReadOnly):
    list_display = ["received_at", "delivery_id", "event", "model_name", "status", "version"]
    list_filter = ["status", "event"]
    list_select_related = ["version__adapter__department"]
    search_fields = ["delivery_id", "model_name", "detail"]


@admin.register(WebhookRefusalCount)
class WebhookRefusalCountAdmin(_ReadOnly):
    list_display = ["window_start", "source", "refused", "throttled", "codes", "audited_at"]
    search_fields = ["source"]


@admin.register(AllowedExperiment)
class AllowedExperimentAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """Which experiments a department may register runs from (audited)."""

    list_display = ["department", "experiment_id", "experiment_name", "created_by", "created_at"]
    list_filter = ["department"]
    fields = ["department", "experiment_id"]

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def service_save(self, actor, obj, form, change):
        return allowed_experiment_create(
            actor=actor,
            department=form.cleaned_data["department"],
            experiment=form.cleaned_data["experiment_id"],
        )

    def service_delete(self, actor, obj):
        allowed_experiment_delete(actor=actor, grant=obj)
