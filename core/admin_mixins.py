"""Shared admin behaviour for rows that change only through services."""


class ReadOnlyAdminMixin:
    """Rows that must only change through services (which audit them)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
