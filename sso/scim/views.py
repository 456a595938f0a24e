"""SCIM 2.0 endpoints (RFC 7644) under /scim/v2/: django-scim2's views with
this project's authentication, error shape, bounds and models.

- Only a SCIM token (`Authorization: Bearer lrs_...`, sso.scim.tokens) is
  accepted: not a session (the views are CSRF-exempt, so a session cookie must
  count for nothing), not an API token. Anything else is a 401 in SCIM's error
  shape (RFC 7644 §3.12).
- Every error, the application's included, is SCIM's error JSON with a 4xx
  that names the problem; bodies past DATA_UPLOAD_MAX_MEMORY_SIZE are a 413.
- Lists and searches return at most SCIM_MAX_RESULTS resources per page;
  filters are bounded (sso.scim.filters).
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import View
from django_scim import exceptions
from django_scim import views as scim_views
from django_scim.constants import SCIM_CONTENT_TYPE
from django_scim.models import SCIMServiceProviderConfig

from core.actors import client_address_of
from core.errors import ApplicationError
from core.middleware import current_request_id
from sso.models import ScimGroup, ScimUser
from sso.scim.adapters import ScimGroupAdapter, ScimUserAdapter
from sso.scim.filters import FilterRefused, GroupFilterQuery, UserFilterQuery
from sso.scim.tokens import ScimActor, scim_token_authenticate

log = logging.getLogger(__name__)

# core.errors codes that are SCIM scimType values as they are (RFC 7644 §3.12).
SCIM_TYPES = {"uniqueness", "invalidValue", "invalidFilter", "mutability", "invalidPath"}


def error_response(status: int, detail: str, scim_type: str | None = None, **headers):
    body = {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:Error"],
        "status": str(status),
        "detail": detail,
    }
    if scim_type:
        body["scimType"] = scim_type
    response = HttpResponse(json.dumps(body), status=status, content_type=SCIM_CONTENT_TYPE)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _unauthorized(detail: str):
    return error_response(401, detail, WWW_Authenticate='Bearer realm="scim"')


def _authenticate(request):
    """The SCIM actor for this request's bearer token, or a 401 response."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, secret = header.partition(" ")
    if not header:
        return _unauthorized("Send 'Authorization: Bearer <SCIM token>'.")
    if scheme.lower() != "bearer" or not secret.strip():
        return _unauthorized("Only 'Authorization: Bearer <SCIM token>' is accepted here.")
    token = scim_token_authenticate(secret.strip())
    if token is None:
        # One message for unknown, expired, revoked and API tokens: no oracle.
        return _unauthorized("Invalid, expired or revoked SCIM token.")
    request.scim_actor = ScimActor(
        user=token.created_by,
        scim_token=token,
        request_id=getattr(request, "request_id", "") or current_request_id(),
        client_address=client_address_of(request),
    )
    return None


@method_decorator(csrf_exempt, name="dispatch")
class ScimViewMixin:
    def dispatch(self, request, *args, **kwargs):
        refused = _authenticate(request)
        if refused is not None:
            return refused
        if request.method.lower() not in self.http_method_names:
            return error_response(405, f"{request.method} is not allowed here.")
        if request.method in ("POST", "PUT", "PATCH"):
            kind = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
            if kind not in ("application/scim+json", "application/json"):
                return error_response(
                    415, "Send the body as application/scim+json (or application/json)."
                )
            try:
                # Read here: inside the library's dispatch every exception
                # but its own becomes a 500 without detail.
                request.body  # noqa: B018
            except RequestDataTooBig:
                return error_response(
                    413,
                    "The request body is larger than "
                    f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE).",
                    Connection="close",
                )
        if not self.implemented:
            return self.status_501(request, *args, **kwargs)
        # The library's dispatch (skipped: View's is called directly) writes
        # `status` as a number; RFC 7644 §3.12 says a string.
        try:
            return View.dispatch(self, request, *args, **kwargs)
        except exceptions.SCIMException as error:
            return error_response(error.status, error.detail, error.scim_type)
        except Exception:
            log.exception("SCIM request failed")
            return error_response(500, "The SCIM request could not be completed.")

    def status_501(self, request, *args, **kwargs):
        return error_response(501, "Not implemented here (no /Me, /Bulk or root search).")

    def load_body(self, body):
        try:
            decoded = body.decode("utf-8")
        except UnicodeDecodeError:
            raise exceptions.BadRequestError(
                "The body is not UTF-8.", scim_type="invalidSyntax"
            ) from None
        try:
            loaded = json.loads(decoded.strip() or "{}")
        except (json.JSONDecodeError, RecursionError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deep"
            raise exceptions.BadRequestError(
                f"The body is not JSON: {detail}.", scim_type="invalidSyntax"
            ) from None
        if not isinstance(loaded, dict):
            raise exceptions.BadRequestError(
                "The request body must be a JSON object.", scim_type="invalidSyntax"
            )
        return loaded

    def _page(self, request):
        def number(name: str, default: int, minimum: int) -> int:
            raw = request.GET.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise exceptions.BadRequestError(
                    f"{name} must be an integer, not {raw[:20]!r}.", scim_type="invalidValue"
                ) from None
            return max(value, minimum)

        # RFC 7644 §3.4.2.4: startIndex < 1 means 1, a negative count means 0.
        start = number("startIndex", 1, 1)
        count = min(number("count", settings.SCIM_MAX_RESULTS, 0), settings.SCIM_MAX_RESULTS)
        return start, count

    def _search(self, request, query, start, count):
        if not isinstance(query, str):
            raise exceptions.BadRequestError("filter must be a string.", scim_type="invalidFilter")
        try:
            queryset = self.__class__.parser_getter().search(query, request)
        except FilterRefused as error:
            raise exceptions.BadRequestError(str(error), scim_type="invalidFilter") from None
        return self._page_of(request, self._visible(queryset), start, count)

    def get_many(self, request):
        query = request.GET.get("filter")
        if query is not None:
            return self._search(request, query, *self._page(request))
        return self._page_of(
            request, self._visible(self.model_cls.objects.all()), *self._page(request)
        )

    def get_single(self, request):
        adapter = self.scim_adapter(self.get_object(), request=request)
        document = self._project(request, adapter.to_dict())
        response = HttpResponse(json.dumps(document), content_type=SCIM_CONTENT_TYPE)
        response["Location"] = adapter.location
        return response

    def _projection(self, request) -> tuple[set[str], set[str]]:
        """RFC 7644 §3.4.2.5 `attributes` / `excludedAttributes`, by top-level
        name (a sub-attribute selects its whole attribute)."""
        source = getattr(self, "search_body", None) or request.GET

        def names(key: str) -> set[str]:
            raw = source.get(key) or ""
            items = raw if isinstance(raw, list) else str(raw).split(",")
            wanted = set()
            for item in items[:50]:
                if not isinstance(item, str):
                    continue
                item = item.strip()
                if item.lower().startswith("urn:"):
                    item = item.rsplit(":", 1)[-1]
                if item:
                    wanted.add(item.split(".")[0].split("[")[0].lower()[:100])
            return wanted

        return names("attributes"), names("excludedAttributes")

    def _project(self, request, document: dict) -> dict:
        attributes, excluded = self._projection(request)
        always = {"id", "schemas"}  # returned "always" (RFC 7643 §3.1, §7)
        if attributes:
            return {k: v for k, v in document.items() if k.lower() in attributes | always}
        if excluded:
            return {k: v for k, v in document.items() if k.lower() not in excluded - always}
        return document

    def _page_of(self, request, queryset, start, count):
        queryset = queryset.order_by("pk")
        total = queryset.count()
        page = list(queryset[start - 1 : start - 1 + count]) if count else []
        resources = [
            self._project(request, self.scim_adapter(o, request=request).to_dict()) for o in page
        ]
        document = {
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
            "totalResults": total,
            "itemsPerPage": len(resources),
            "startIndex": start,
            "Resources": resources,
        }
        return HttpResponse(json.dumps(document), content_type=SCIM_CONTENT_TYPE)

    def _visible(self, queryset):
        return queryset

    def get_object(self):
        uuid = self.kwargs.get(self.lookup_url_kwarg)
        obj = self._visible(self.model_cls.objects.all()).filter(scim_id=uuid).first()
        if obj is None:
            raise exceptions.NotFoundError(str(uuid)[:64])
        return obj


def _application_errors(method):
    """A service's ApplicationError (a 409 duplicate, a 400) as a SCIM error."""

    def wrapped(self, request, *args, **kwargs):
        try:
            return method(self, request, *args, **kwargs)
        except ApplicationError as error:
            scim_type = error.code if error.code in SCIM_TYPES else None
            raise exceptions.SCIMException(
                error.message, status=error.status, scim_type=scim_type
            ) from None

    return wrapped


class _Writes:
    post = _application_errors(scim_views.PostView.post)
    put = _application_errors(scim_views.PutView.put)
    patch = _application_errors(scim_views.PatchView.patch)
    delete = _application_errors(scim_views.DeleteView.delete)


class UsersView(ScimViewMixin, _Writes, scim_views.UsersView):
    # The library calls these getters on the class: functions, not the classes.
    scim_adapter_getter = staticmethod(lambda: ScimUserAdapter)
    model_cls_getter = staticmethod(lambda: ScimUser)
    parser_getter = staticmethod(lambda: UserFilterQuery)

    def _visible(self, queryset):
        # A DELETEd user is gone as far as SCIM is concerned (404), though the
        # account stays for the audit log.
        return queryset.filter(deleted_at__isnull=True).select_related("user")


class _SearchBody:
    """POST .search (RFC 7644 §3.4.3): filter, attributes and paging from the body."""

    def post(self, request, *args, **kwargs):
        body = self.load_body(request.body)
        self.search_body = body
        query = body.get("filter")
        if query is None:
            raise exceptions.BadRequestError("A search needs a filter.", scim_type="invalidFilter")
        start, count = self._page(request)
        for name in ("startIndex", "count"):
            if name in body and not isinstance(body[name], int):
                raise exceptions.BadRequestError(
                    f"{name} must be an integer.", scim_type="invalidValue"
                )
        if isinstance(body.get("startIndex"), int):
            start = max(body["startIndex"], 1)
        if isinstance(body.get("count"), int):
            count = min(max(body["count"], 0), settings.SCIM_MAX_RESULTS)
        return self._search(request, query, start, count)


class UserSearchView(ScimViewMixin, _SearchBody, scim_views.UserSearchView):
    # The library calls these getters on the class: functions, not the classes.
    scim_adapter_getter = staticmethod(lambda: ScimUserAdapter)
    model_cls_getter = staticmethod(lambda: ScimUser)
    parser_getter = staticmethod(lambda: UserFilterQuery)

    def _visible(self, queryset):
        return queryset.filter(deleted_at__isnull=True).select_related("user")


class GroupsView(ScimViewMixin, _Writes, scim_views.GroupsView):
    scim_adapter_getter = staticmethod(lambda: ScimGroupAdapter)
    model_cls_getter = staticmethod(lambda: ScimGroup)
    parser_getter = staticmethod(lambda: GroupFilterQuery)


class GroupSearchView(ScimViewMixin, _SearchBody, scim_views.GroupSearchView):
    scim_adapter_getter = staticmethod(lambda: ScimGroupAdapter)
    model_cls_getter = staticmethod(lambda: ScimGroup)
    parser_getter = staticmethod(lambda: GroupFilterQuery)


class ServiceProviderConfig(SCIMServiceProviderConfig):
    def to_dict(self):
        d = super().to_dict()
        d.update(
            {
                "documentationUri": None,
                "patch": {"supported": True},
                "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
                "filter": {"supported": True, "maxResults": settings.SCIM_MAX_RESULTS},
                "changePassword": {"supported": False},
                "sort": {"supported": False},
                "etag": {"supported": False},
                "authenticationSchemes": [
                    {
                        "type": "oauthbearertoken",
                        "name": "SCIM token",
                        "description": "A SCIM token a platform admin minted "
                        "(manage.py scim_token create).",
                        "primary": True,
                    }
                ],
            }
        )
        d.pop("documentationUri")
        return d


class ServiceProviderConfigView(ScimViewMixin, scim_views.ServiceProviderConfigView):
    pass


def _list_of(resources: list[dict]) -> HttpResponse:
    document = {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
        "totalResults": len(resources),
        "itemsPerPage": len(resources),
        "startIndex": 1,
        "Resources": resources,
    }
    return HttpResponse(json.dumps(document), content_type=SCIM_CONTENT_TYPE)


class _Listing:
    """GET of a fixed collection (resource types, schemas): a complete
    ListResponse, and a SCIM error for an id that is not there."""

    def _collection(self, request) -> dict[str, dict]:
        raise NotImplementedError

    def get(self, request, uuid=None, *args, **kwargs):
        collection = self._collection(request)
        if uuid:
            if uuid not in collection:
                return error_response(404, f"No {self.kind} {uuid[:100]!r} here.")
            return HttpResponse(json.dumps(collection[uuid]), content_type=SCIM_CONTENT_TYPE)
        return _list_of([collection[key] for key in sorted(collection)])


class ResourceTypesView(ScimViewMixin, _Listing, scim_views.ResourceTypesView):
    kind = "resource type"

    def _collection(self, request):
        return self.type_dict_by_type_id(request)

    def type_dict_by_type_id(self, request):
        types = [
            ScimUserAdapter.resource_type_dict(request),
            ScimGroupAdapter.resource_type_dict(request),
        ]
        return {d["id"]: d for d in types}


class SchemasView(ScimViewMixin, _Listing, scim_views.SchemasView):
    kind = "schema"

    def _collection(self, request):
        return self.schemas_by_uri


class NotImplementedView(ScimViewMixin, scim_views.SCIMView):
    implemented = False


class UnknownView(ScimViewMixin, scim_views.SCIMView):
    http_method_names = ["get", "post", "put", "patch", "delete"]

    def dispatch(self, request, *args, **kwargs):
        refused = _authenticate(request)
        if refused is not None:
            return refused
        return error_response(404, f"Nothing at {request.path[:200]!r}.")


def base_location(request=None, *args, **kwargs) -> str:
    """Where resources' `location`s point: this request's own scheme and host
    (the host is one of ALLOWED_HOSTS, or Django refused the request)."""
    if request is None:
        return ""
    return f"{request.scheme}://{request.get_host()}"
