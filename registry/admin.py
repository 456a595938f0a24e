"""Admin screens. Every change goes through the same services as the API
(four-eyes, comment on reject, audit); audit events cannot be changed."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html

from core.actors import actor_from_request
from core.admin_mixins import ReadOnlyAdminMixin, ServiceAdminMixin
from core.errors import ApplicationError
from registry.lineage import run_ui_url
from registry.models import Adapter, AdapterVersion, ArtifactSource, VersionStatus
from registry.services.adapters import adapter_update
from registry.services.artifact_sources import (
    artifact_source_create,
    artifact_source_delete,
    artifact_source_update,
)
from registry.services.versions import version_transition


@admin.register(Adapter)
class AdapterAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """Description and owners change through adapter_update (audited); adapters
    are created from the web UI or the API."""

    list_display = ["name", "department", "served_name", "base_model", "last_version_number"]
    list_filter = ["department"]
    search_fields = ["name", "served_name"]
    readonly_fields = ["department", "name", "served_name", "base_model", "last_version_number"]
    fields = [*readonly_fields, "description", "owners"]
    list_select_related = ["department"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def service_save(self, actor, obj, form, change):
        return adapter_update(
            actor=actor,
            adapter=Adapter.objects.get(pk=obj.pk),
            description=form.cleaned_data["description"],
            owners=[user.get_username() for user in form.cleaned_data["owners"]],
        )


class ArtifactSourceForm(forms.ModelForm):
    secret_access_key = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Encrypted at rest and never shown. Leave empty to keep the current one.",
    )

    class Meta:
        model = ArtifactSource
        fields = [
            "department",
            "uri_prefix",
            "endpoint_url",
            "region",
            "access_key_id",
            "secret_access_key",
        ]


@admin.register(ArtifactSource)
class ArtifactSourceAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """Where each department may register from S3; see registry.source_policy."""

    form = ArtifactSourceForm
    list_display = ["uri_prefix", "department", "endpoint_url", "access_key_id", "updated_at"]
    list_filter = ["department"]
    list_select_related = ["department"]

    def get_readonly_fields(self, request, obj=None):
        return ["department"] if obj is not None else []

    def service_save(self, actor, obj, form, change):
        values = {
            name: form.cleaned_data[name]
            for name in ("uri_prefix", "endpoint_url", "region", "access_key_id")
        }
        if form.cleaned_data["secret_access_key"]:
            values["secret_access_key"] = form.cleaned_data["secret_access_key"]
        if change:
            return artifact_source_update(
                actor=actor, source=ArtifactSource.objects.get(pk=obj.pk), **values
            )
        return artifact_source_create(actor=actor, department=obj.department, **values)

    def service_delete(self, actor, obj):
        artifact_source_delete(actor=actor, source=obj)


class ReviewCommentForm(forms.Form):
    comment = forms.CharField(widget=forms.Textarea, required=False)


class PendingFilter(admin.SimpleListFilter):
    title = "review"
    parameter_name = "review"

    def lookups(self, request, model_admin):
        return [("pending", "Pending review")]

    def queryset(self, request, queryset):
        if self.value() == "pending":
            return queryset.filter(status=VersionStatus.PENDING_REVIEW)
        return queryset


@admin.register(AdapterVersion)
class AdapterVersionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "__str__",
        "status",
        "department",
        "r",
        "total_size",
        "registered_by",
        "mlflow_run",
        "created_at",
    ]
    list_filter = [PendingFilter, "status", "adapter__department"]
    search_fields = ["adapter__name", "manifest_sha256", "mlflow_run_id", "mlflow_experiment_name"]
    list_select_related = ["adapter__department", "registered_by"]
    actions = ["approve_selected", "reject_selected"]

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    @admin.display(ordering="adapter__department__slug")
    def department(self, obj):
        return obj.adapter.department.slug

    @admin.display(description="MLflow run")
    def mlflow_run(self, obj):
        url = run_ui_url(obj.mlflow_experiment_id, obj.mlflow_run_id)
        if not url and obj.mlflow_run_uri.startswith(("http://", "https://")):
            url = obj.mlflow_run_uri
        if url:
            label = obj.mlflow_experiment_name or obj.mlflow_run_id
            return format_html('<a href="{}">{} / {}</a>', url, label, obj.mlflow_run_id[:8])
        return obj.mlflow_run_id or "-"

    def _review(self, request, queryset, action: str):
        if "apply" in request.POST:
            form = ReviewCommentForm(request.POST)
            form.is_valid()
            actor = actor_from_request(request)
            done = 0
            for version in queryset:
                try:
                    version_transition(
                        actor=actor,
                        version=version,
                        action=action,
                        comment=form.cleaned_data.get("comment", ""),
                    )
                    done += 1
                except ApplicationError as error:
                    self.message_user(request, f"{version}: {error.message}", messages.ERROR)
            if done:
                self.message_user(
                    request, f"{action.title()}d {done} version(s).", messages.SUCCESS
                )
            return HttpResponseRedirect(request.get_full_path())
        return TemplateResponse(
            request,
            "admin/registry/review_confirm.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{action.title()} versions",
                "action": f"{action}_selected",
                "verb": action,
                "versions": queryset,
                "form": ReviewCommentForm(),
                "opts": self.model._meta,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Approve selected versions (four-eyes applies)")
    def approve_selected(self, request, queryset):
        return self._review(request, queryset, "approve")

    @admin.action(description="Reject selected versions (comment required)")
    def reject_selected(self, request, queryset):
        return self._review(request, queryset, "reject")
