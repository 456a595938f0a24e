from drf_spectacular.plumbing import build_basic_type, build_parameter_type
from drf_spectacular.types import OpenApiTypes
from rest_framework.pagination import PageNumberPagination

from core.errors import ValidationFailed


class StandardPagination(PageNumberPagination):
    """DRF's page-number pagination, strict about its two parameters.

    DRF silently ignores a `page_size` it cannot parse or that is out of range
    (and clamps one over the maximum), so a client with a bug gets a page it
    did not ask for. Here a malformed or out-of-range `page` / `page_size` is a
    400 naming the parameter, and the schema declares the bounds.
    """

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        self._strict(request, self.page_query_param, maximum=None)
        self._strict(request, self.page_size_query_param, maximum=self.max_page_size)
        return super().paginate_queryset(queryset, request, view)

    @staticmethod
    def _strict(request, name: str, maximum: int | None) -> None:
        values = request.query_params.getlist(name)
        if not values:
            return
        bounds = f"1 to {maximum}" if maximum else "1 or more"
        raw = values[0]
        if len(values) > 1 or not (raw.isascii() and raw.isdigit()):
            raise ValidationFailed(
                f"{name} must be one whole number ({bounds}).", code=f"invalid_{name}"
            )
        if int(raw) < 1 or (maximum and int(raw) > maximum):
            raise ValidationFailed(f"{name} must be {bounds}, got {raw}.", code=f"invalid_{name}")

    def get_schema_operation_parameters(self, view):
        page = build_parameter_type(
            name=self.page_query_param,
            schema={**build_basic_type(OpenApiTypes.INT), "minimum": 1},
            location="query",
            description="A page number within the paginated result set.",
        )
        size = build_parameter_type(
            name=self.page_size_query_param,
            schema={
                **build_basic_type(OpenApiTypes.INT),
                "minimum": 1,
                "maximum": self.max_page_size,
            },
            location="query",
            description=f"Results per page, 1 to {self.max_page_size} (default {self.page_size}).",
        )
        return [page, size]
