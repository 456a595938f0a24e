"""What every filtered list of the API stands on, and the audit feed's filter."""

from datetime import UTC

import django_filters
from django import forms
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field

from core.models import AuditEvent

MAX_ID = 2**63 - 1  # a database integer; a larger one was a 500 (overflow), not a 400


class StrictFilterSet(django_filters.FilterSet):
    """django-filter skips a parameter given empty (`?status=`, `?until=`) as if
    it were absent; the schema says it is an enum / a date-time, so it is a 400.
    An empty text filter is a valid string and still matches as before."""

    def is_valid(self):
        valid = super().is_valid()
        for name, value in self.data.items():
            declared = self.filters.get(name)
            if value == "" and declared and not isinstance(declared, django_filters.CharFilter):
                self.form.add_error(name, "Give a value or leave the parameter out.")
                valid = False
        return valid


class StrictFilterBackend(DjangoFilterBackend):
    # Also the base of the FilterSets built from a view's `filterset_fields`.
    filterset_base = StrictFilterSet


class _IntegerField(forms.IntegerField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IntegerFilter(django_filters.NumberFilter):
    # NumberFilter parses a decimal, so ?number=0.5 matched nothing instead of
    # being refused as the integer the schema declares.
    field_class = _IntegerField


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time with any offset Python accepts (up to ±23:59), compared in
    UTC: PostgreSQL refuses a displacement beyond ±15:59, which was a 500."""

    def filter(self, qs, value):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return super().filter(qs, value)


class AuditEventFilter(StrictFilterSet):
    department = django_filters.CharFilter(field_name="department__slug")
    action = django_filters.CharFilter()
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor__username")
    since = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["department", "action", "object_type", "object_id", "request_id"]
