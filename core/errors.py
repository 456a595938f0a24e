"""The one application error type. The API's exception handler turns it into
the single error format; the admin and the web UI show its message."""

from __future__ import annotations


class ApplicationError(Exception):
    status = 400
    code = "invalid"
    # Shown to members through core.redaction unless the message is only the
    # caller's own input and what their department may know (`public`).
    public = False

    def __init__(self, message: str, *, code: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details or {}


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"


class NotAuthorized(ApplicationError):
    status = 403
    code = "forbidden"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class ReferenceNotFound(NotFound):
    """A name the request's body gives (an owner, a department) names nothing:
    a 404 in the API, like the object of the URL; on a page, an error on the
    form that named it, not the 404 page."""

    code = "reference_not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class DependencyUnavailable(ApplicationError):
    status = 503
    code = "unavailable"
