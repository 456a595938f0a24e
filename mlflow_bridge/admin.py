"""Admin screens for the MLflow mirror state: read-only, changed only by the
mirror services (run `manage.py mlflow_resync` to push again)."""

from __future__ import annotations

from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin
from mlflow_bridge.models import MlflowAliasMirror, MlflowVersionMirror


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
