from django.contrib import admin

from core.admin_mixins import ReadOnlyAdminMixin
from sso.models import Identity, ScimGroup, ScimToken, ScimUser


@admin.register(Identity)
class IdentityAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Who signs in through the provider, and the groups it sent last time.
    Read-only: the provider is the source, and every sign-in rewrites it."""

    list_display = [
        "user",
        "subject",
        "issuer",
        "groups",
        "last_sign_in_at",
        "checked_at",
        "check_result",
    ]
    exclude = ["refresh_token_encrypted"]
    search_fields = ["user__username", "subject"]
    list_select_related = ["user"]

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff


class _AdminsOnly(ReadOnlyAdminMixin, admin.ModelAdmin):
    """What the provider pushed through SCIM. Read-only: the provider is the
    source; tokens are minted and revoked with `manage.py scim_token` (audited)."""

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff


@admin.register(ScimUser)
class ScimUserAdmin(_AdminsOnly):
    list_display = ["user", "scim_id", "external_id", "deleted_at"]
    search_fields = ["user__username", "external_id", "scim_id"]
    list_select_related = ["user"]


@admin.register(ScimGroup)
class ScimGroupAdmin(_AdminsOnly):
    list_display = ["display_name", "scim_id", "external_id", "updated_at"]
    search_fields = ["display_name", "external_id"]


@admin.register(ScimToken)
class ScimTokenAdmin(_AdminsOnly):
    list_display = ["name", "prefix", "created_by", "expires_at", "revoked_at", "last_used_at"]
    exclude = ["secret_sha256"]
