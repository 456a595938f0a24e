"""Refuses request bodies larger than the ingest limit, before they cost anything.

Two guards. A declared Content-Length above INGEST_MAX_BYTES plus a small
multipart allowance is a 413 before one byte of the body is read. A multipart
body within that declaration still has its file parts counted as they arrive
(every upload handler after this one sees them: the streaming ingest handler,
Django's temporary files), and the upload is cut off with a 413 the moment the
files pass INGEST_MAX_BYTES, instead of landing on disk first.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpResponse, JsonResponse

from core.errors import ApplicationError
from core.middleware import current_request_id


class RequestTooLarge(ApplicationError):
    status = 413
    code = "request_too_large"


def _human(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def body_limit() -> int:
    return settings.INGEST_MAX_BYTES + settings.INGEST_MULTIPART_ALLOWANCE_BYTES


def too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than the {_human(limit)} limit (INGEST_MAX_BYTES).",
        details={"limit_bytes": limit},
    )


class BodyLimitHandler(FileUploadHandler):
    """Counts every file part's bytes and passes them on; raises past the limit."""

    def __init__(self, request, limit: int):
        super().__init__(request)
        self.limit = limit
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > self.limit:
            raise too_large(self.limit)
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
    else:
        response = HttpResponse(error.message, status=error.status, content_type="text/plain")
    # The unread body is still on the socket: this connection cannot carry another request.
    response["Connection"] = "close"
    return response


class BodySizeLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # Django reads no body then
        if declared > body_limit():
            return _response(request, too_large(body_limit()))
        if request.META.get("CONTENT_TYPE", "").startswith("multipart/"):
            request.upload_handlers.insert(0, BodyLimitHandler(request, settings.INGEST_MAX_BYTES))
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
