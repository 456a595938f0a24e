from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin
from sso.models import Identity


@admin.register(Identity)
class IdentityAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Who signs in through the provider, and the groups it sent last time.
    Read-only: the provider is the source, and every sign-in rewrites it."""

    list_display = ["user", "subject", "issuer", "groups", "last_sign_in_at"]
    search_fields = ["user__username", "subject"]
    list_select_related = ["user"]

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff
