"""A thin wrapper around mlflow-skinny's MlflowClient: timeouts from settings,
and every failure mapped to one of three errors the services understand.

- MlflowUnavailable: transient (connection refused, timeout, 5xx, 429). Retry later.
- MlflowNotFound: the server answered RESOURCE_DOES_NOT_EXIST.
- MlflowRejected: any other answer; retrying the same call will not help.
"""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from mlflow import MlflowClient


class MlflowCallError(Exception):
    transient = False

    def __init__(self, message: str, *, error_code: str = ""):
        super().__init__(message)
        self.message = message
        self.error_code = error_code


class MlflowUnavailable(MlflowCallError):
    transient = True


class MlflowNotFound(MlflowCallError):
    pass


class MlflowRejected(MlflowCallError):
    pass


_TRANSIENT_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
_NOT_FOUND_CODES = {"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"}
_CONNECTION_FAILURE = re.compile(r"failed with (timeout )?exception")
_NON_JSON_STATUS = re.compile(r"failed with error code (\d{3}) != 200")


def is_enabled() -> bool:
    return bool(settings.MLFLOW_TRACKING_URI)


def mirror_enabled() -> bool:
    return is_enabled() and bool(getattr(settings, "MLFLOW_MIRROR_ENABLED", True))


def _configure_http() -> None:
    # mlflow reads its HTTP behaviour only from the environment, at each call.
    # Its defaults (120 s timeout, 7 retries with backoff) would hold a request
    # thread for minutes while MLflow is down; the registry answers 503 instead
    # and the mirror tasks retry on their own schedule.
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(settings.MLFLOW_HTTP_TIMEOUT)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(settings.MLFLOW_HTTP_MAX_RETRIES)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    if settings.MLFLOW_TRACKING_TOKEN:
        os.environ["MLFLOW_TRACKING_TOKEN"] = settings.MLFLOW_TRACKING_TOKEN


def get_client() -> MlflowClient:
    """A client for settings.MLFLOW_TRACKING_URI (tracking and model registry)."""
    if not is_enabled():
        raise MlflowRejected("MLflow is not configured (MLFLOW_TRACKING_URI is empty).")
    _configure_http()
    # Imported here: mlflow takes seconds to import, and most processes never need it.
    from mlflow import MlflowClient

    uri = settings.MLFLOW_TRACKING_URI
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def translate(error: BaseException) -> MlflowCallError:
    """Maps an exception raised by mlflow (or requests underneath it) to our three kinds."""
    import requests
    from mlflow.exceptions import MlflowException

    where = settings.MLFLOW_TRACKING_URI
    if isinstance(error, MlflowCallError):
        return error
    if isinstance(error, requests.RequestException | ConnectionError | TimeoutError):
        return MlflowUnavailable(f"MLflow at {where} is unreachable: {_short(error)}")
    if isinstance(error, MlflowException):
        code = str(getattr(error, "error_code", "") or "")
        try:
            http_status = error.get_http_status_code()
        except Exception:  # older or odd exception classes
            http_status = 500
        cause = error.__cause__ or error.__context__
        message = str(error.message)
        if isinstance(cause, requests.RequestException) or _CONNECTION_FAILURE.search(message):
            # mlflow wraps connection failures as INTERNAL_ERROR with this phrase.
            return MlflowUnavailable(
                f"MLflow at {where} is unreachable: {_short(error)}", error_code=code
            )
        if status_in_text := _NON_JSON_STATUS.search(message):
            # A non-JSON error page (a proxy, a wrong path): mlflow only says the status.
            http_status = int(status_in_text.group(1))
        if code in _NOT_FOUND_CODES or http_status == 404:
            return MlflowNotFound(error.message, error_code=code)
        if code in _TRANSIENT_CODES or http_status >= 500 or http_status == 429:
            return MlflowUnavailable(f"MLflow at {where} failed: {_short(error)}", error_code=code)
        return MlflowRejected(error.message, error_code=code)
    return MlflowRejected(f"{type(error).__name__}: {error}")


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(getattr(error, "message", "") or error)
    return text if len(text) <= limit else text[:limit] + "…"


def mapped(function):
    """Decorator: any exception from inside becomes an MlflowCallError."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except MlflowCallError:
            raise
        except Exception as error:
            raise translate(error) from error

    return wrapper


def model_version_ui_url(name: str, version: str) -> str:
    base = getattr(settings, "MLFLOW_UI_URL", "") or settings.MLFLOW_TRACKING_URI
    if not (base and name and version):
        return ""
    return f"{base}/#/models/{name}/versions/{version}"
