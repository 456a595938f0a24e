"""One error format for every 4xx and 5xx the API returns:

{"error": {"status": 409, "code": "invalid_transition", "message": "...",
           "details": {...}, "request_id": "..."}}
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import ApplicationError
from core.middleware import current_request_id
from core.redaction import redact


def error_response(status_code: int, code: str, message: str, details=None, headers=None):
    body = {
        "error": {
            "status": status_code,
            "code": code,
            "message": message,
            "details": details or {},
            "request_id": current_request_id(),
        }
    }
    return Response(body, status=status_code, headers=headers)


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


@csrf_exempt  # like every API view: a POST to a wrong path is a 404, not an HTML 403
def api_not_found(request, *args, **kwargs):
    """Any /api/ path no route matches: the JSON error, not the web UI's HTML page."""
    from django.http import JsonResponse

    body = {
        "error": {
            "status": 404,
            "code": "not_found",
            "message": f"No API endpoint at {request.path}.",
            "details": {},
            "request_id": current_request_id(),
        }
    }
    return JsonResponse(body, status=404)


def _shown_to(context, error: ApplicationError) -> str:
    """Platform admins read errors whole; everyone else through the one redaction."""
    message = error.message
    if error.public:
        return message
    request = context.get("request")
    # What authentication already found; asking `request.user` again would re-run it.
    user = getattr(request, "_user", None)
    token = getattr(request, "_auth", None)
    if user is not None and user.is_active and user.is_staff and token is None:
        return message
    return redact(message)


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        return error_response(
            exc.status,
            exc.code,
            _shown_to(context, exc),
            exc.details,
            headers=getattr(exc, "headers", None),  # e.g. a 429's Retry-After
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        return error_response(
            status.HTTP_400_BAD_REQUEST,
            "invalid",
            _flatten(exc.detail),
            {"fields": exc.detail},
        )
    detail = getattr(exc, "detail", "")
    code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
    headers = {
        k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After", "Allow")
    }
    return error_response(response.status_code, str(code), _flatten(detail), headers=headers)
