"""Refuses request bodies larger than their view may take, before they cost anything.

Only multipart uploads to the ingest views (marked with `accepts_large_body`)
take bodies up to INGEST_MAX_BYTES; those views authenticate and check CSRF
before they read one byte, and their files stream to staging as they arrive.
Every other body keeps Django's small limit (DATA_UPLOAD_MAX_MEMORY_SIZE),
file parts included: the sign-in page's, so that an anonymous POST costs no
staging space before anyone is known, and any JSON or form body, even a
member's or a token's to an ingest view, since those are read into memory whole.

Two guards. A declared Content-Length above the view's limit (plus, for
ingest, a small multipart allowance) is a 413 before one byte of the body is
read. A multipart body within that declaration still has its file parts
counted as they arrive (every upload handler after this one sees them: the
streaming ingest handler, Django's temporary files), and the upload is cut off
with a 413 the moment the files pass the limit, instead of landing on disk first.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from core.errors import ApplicationError
from core.middleware import current_request_id


class RequestTooLarge(ApplicationError):
    status = 413
    code = "request_too_large"


def _human(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def body_limit() -> int:
    return settings.INGEST_MAX_BYTES + settings.INGEST_MULTIPART_ALLOWANCE_BYTES


def too_large(limit: int, setting: str = "INGEST_MAX_BYTES") -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than the {_human(limit)} limit ({setting}).",
        details={"limit_bytes": limit},
    )


def accepts_large_body(view):
    """Marks an ingest view (a function, or a viewset action): only these take
    multipart bodies past Django's small limit, and each must authenticate and
    check CSRF before it reads the body."""
    view.accepts_large_body = True
    return view


def _takes_large_body(request, match) -> bool:
    if match is None:
        return False
    view = match.func
    if getattr(view, "accepts_large_body", False):
        return True
    # A DRF viewset route: the mark sits on the action that serves this method.
    action = (getattr(view, "actions", None) or {}).get(request.method.lower())
    handler = getattr(getattr(view, "cls", None), action or "", None)
    return bool(getattr(handler, "accepts_large_body", False))


def _resolve(request):
    try:
        return resolve(request.path_info)
    except Resolver404:
        return None


class BodyLimitHandler(FileUploadHandler):
    """Counts every file part's bytes and passes them on; raises past the limit."""

    def __init__(self, request, limit: int, setting: str = "INGEST_MAX_BYTES"):
        super().__init__(request)
        self.limit = limit
        self.setting = setting
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > self.limit:
            raise too_large(self.limit, self.setting)
        return raw_data

    def file_complete(self, file_size):
        return None


def insert_upload_handler(django_request, handler) -> bool:
    """Puts `handler` at the front of the request's upload handlers, behind
    the body-limit guard if it is there: the guard must count every byte the
    others take. False if the body was already read (handlers can't change)."""
    handlers = list(django_request.upload_handlers)
    first = 1 if handlers and isinstance(handlers[0], BodyLimitHandler) else 0
    try:
        django_request.upload_handlers = [*handlers[:first], handler, *handlers[first:]]
    except AttributeError:
        return False
    return True


def _response(request, error: RequestTooLarge):
    response: HttpResponse
    body: dict[str, object]
    if request.path.startswith("/api/"):
        body = {
            "error": {
                "status": error.status,
                "code": error.code,
                "message": error.message,
                "details": error.details,
                "request_id": current_request_id(),
            }
        }
        response = JsonResponse(body, status=error.status)
    elif request.path.startswith("/scim/"):
        # SCIM's own error shape (RFC 7644 §3.12): the identity provider parses it.
        body = {
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:Error"],
            "status": str(error.status),
            "detail": error.message,
        }
        response = JsonResponse(body, status=error.status, content_type="application/scim+json")
    else:
        response = HttpResponse(error.message, status=error.status, content_type="text/plain")
    # The unread body is still on the socket, so this connection cannot carry
    # another request. Closing it is the server's to do (PEP 3333 forbids the
    # application hop-by-hop headers such as Connection): gunicorn reads at most
    # 64 KiB of what is left and closes; so does `runserver` (config/management/).
    return response


class BodySizeLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # Django reads no body then
        if (
            declared
            and request.content_type == "multipart/form-data"
            and _takes_large_body(request, _resolve(request))
        ):
            declared_limit, files_limit = body_limit(), settings.INGEST_MAX_BYTES
            setting = "INGEST_MAX_BYTES"
        else:
            declared_limit = files_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            setting = "DATA_UPLOAD_MAX_MEMORY_SIZE"
        if declared > declared_limit:
            return _response(request, too_large(declared_limit, setting))
        if request.META.get("CONTENT_TYPE", "").startswith("multipart/"):
            request.upload_handlers.insert(0, BodyLimitHandler(request, files_limit, setting))
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        # CsrfViewMiddleware parses the body of every POST it checks, where a 413
        # raised by the handler would become a 500. Parse it here first instead.
        if (
            request.method == "POST"
            and request.META.get("CONTENT_TYPE", "").startswith("multipart/")
            and not getattr(view_func, "csrf_exempt", False)
        ):
            try:
                request.POST  # noqa: B018 - parsing is the point
            except RequestTooLarge as error:
                return _response(request, error)
        return None
