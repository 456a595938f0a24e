import django_filters
from django import forms
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from core.models import AuditEvent
from registry.models import Adapter, AdapterVersion, VersionStatus


class AdapterFilter(django_filters.FilterSet):
    department = django_filters.CharFilter(field_name="department__slug")
    name = django_filters.CharFilter()
    served_name = django_filters.CharFilter()
    search = django_filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = Adapter
        fields = ["department", "name", "served_name", "base_model"]


class _PresentMeansGiven:
    """A parameter that is present must hold a value: `?until=` is refused
    (400) rather than silently ignored, as the schema's type says."""

    def to_python(self, value):
        if value == "":
            raise forms.ValidationError("Give a value or leave the parameter out.")
        return super().to_python(value)


class _IntegerField(_PresentMeansGiven, forms.IntegerField):
    pass


class _DateTimeField(_PresentMeansGiven, django_filters.fields.IsoDateTimeField):
    pass


@extend_schema_field(OpenApiTypes.INT)
class IntegerFilter(django_filters.NumberFilter):
    # NumberFilter parses a decimal, so ?number=0.5 matched nothing instead of
    # being refused as the integer the schema declares.
    field_class = _IntegerField


class DateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = _DateTimeField


class VersionFilter(django_filters.FilterSet):
    department = django_filters.CharFilter(field_name="adapter__department__slug")
    number = IntegerFilter()
    adapter = IntegerFilter(field_name="adapter_id")
    status = django_filters.MultipleChoiceFilter(choices=VersionStatus.choices)
    mlflow_run_id = django_filters.CharFilter()

    class Meta:
        model = AdapterVersion
        fields = ["department", "adapter", "status", "number", "mlflow_run_id"]


class AuditEventFilter(django_filters.FilterSet):
    department = django_filters.CharFilter(field_name="department__slug")
    action = django_filters.CharFilter()
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor__username")
    since = DateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = DateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["department", "action", "object_type", "object_id", "request_id"]
