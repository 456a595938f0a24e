import django_filters

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


class VersionFilter(django_filters.FilterSet):
    department = django_filters.CharFilter(field_name="adapter__department__slug")
    adapter = django_filters.NumberFilter(field_name="adapter_id")
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
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["department", "action", "object_type", "object_id", "request_id"]
