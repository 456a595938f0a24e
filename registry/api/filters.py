import django_filters

from core.api.filters import IntegerFilter, StrictFilterSet
from registry.models import Adapter, AdapterVersion, VersionStatus


class AdapterFilter(StrictFilterSet):
    department = django_filters.CharFilter(field_name="department__slug")
    name = django_filters.CharFilter()
    served_name = django_filters.CharFilter()
    search = django_filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = Adapter
        fields = ["department", "name", "served_name", "base_model"]


class VersionFilter(StrictFilterSet):
    department = django_filters.CharFilter(field_name="adapter__department__slug")
    number = IntegerFilter()
    adapter = IntegerFilter(field_name="adapter_id")
    status = django_filters.MultipleChoiceFilter(choices=VersionStatus.choices)
    mlflow_run_id = django_filters.CharFilter()

    class Meta:
        model = AdapterVersion
        fields = ["department", "adapter", "status", "number", "mlflow_run_id"]
