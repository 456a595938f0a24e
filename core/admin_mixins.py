"""Shared admin behaviour for rows that change only through services."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse

from core.actors import actor_from_request
from core.errors import ApplicationError


class ReadOnlyAdminMixin:
    """Rows that must only change through services (which audit them)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ServiceAdminMixin:
    """Saves and deletes through the services, so the admin is checked and
    audited like every other face. Subclasses implement `service_save`
    (returning the saved row) and `service_delete`. A refusal is shown as an
    error message and nothing is written; m2m fields and inlines are the
    service's job, never the form's."""

    def service_save(self, actor, obj, form, change):
        raise NotImplementedError

    def service_delete(self, actor, obj):
        raise NotImplementedError

    def _refused(self, request, error: ApplicationError) -> None:
        request._service_refusal = error.message

    def save_model(self, request, obj, form, change):
        try:
            saved = self.service_save(actor_from_request(request), obj, form, change)
        except ApplicationError as error:
            self._refused(request, error)
            return
        obj.pk = saved.pk

    def save_related(self, request, form, formsets, change):
        for formset in formsets:
            # What formset.save() would have set; the admin's change message reads it.
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []

    def delete_model(self, request, obj):
        try:
            self.service_delete(actor_from_request(request), obj)
        except ApplicationError as error:
            self._refused(request, error)

    def delete_queryset(self, request, queryset):
        # The bulk action too: one service call (and audit event) per row.
        for obj in queryset:
            self.delete_model(request, obj)

    def _refusal_response(self, request):
        refusal = getattr(request, "_service_refusal", None)
        if refusal is None:
            return None
        self.message_user(request, refusal, messages.ERROR)
        opts = self.model._meta
        return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))

    def log_addition(self, request, obj, message):
        if getattr(request, "_service_refusal", None) is None:
            return super().log_addition(request, obj, message)
        return None

    def log_change(self, request, obj, message):
        if getattr(request, "_service_refusal", None) is None:
            return super().log_change(request, obj, message)
        return None

    def response_add(self, request, obj, post_url_continue=None):
        return self._refusal_response(request) or super().response_add(
            request, obj, post_url_continue
        )

    def response_change(self, request, obj):
        return self._refusal_response(request) or super().response_change(request, obj)

    def response_delete(self, request, obj_display, obj_id):
        return self._refusal_response(request) or super().response_delete(
            request, obj_display, obj_id
        )
