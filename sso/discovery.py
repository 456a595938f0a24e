"""The provider's endpoints, from OIDC_ISSUER's discovery document.

mozilla-django-oidc wants each endpoint as a setting. With only OIDC_ISSUER set,
config/settings.py puts `endpoint("...")` in those settings: a lazy string that
fetches `<issuer>/.well-known/openid-configuration` the first time it is used
and keeps it for the life of the process. Start-up never waits for the
provider, and a provider that is down breaks sign-in only, not every page
(local logins and API tokens go on working).
"""

from __future__ import annotations

import json
import logging
import threading

import requests
from django.conf import settings
from django.utils.functional import lazy

log = logging.getLogger(__name__)

MAX_DOCUMENT_BYTES = 512 * 1024
_cache: dict[str, dict] = {}
_lock = threading.Lock()


class ProviderUnavailable(Exception):
    """The discovery document could not be had or does not describe this issuer."""


def metadata(issuer: str | None = None) -> dict:
    issuer = (issuer or settings.OIDC_ISSUER).rstrip("/")
    with _lock:
        if issuer in _cache:
            return _cache[issuer]
    document = _fetch(issuer)
    with _lock:
        _cache[issuer] = document
    return document


def _fetch(issuer: str) -> dict:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        with requests.get(
            url,
            timeout=settings.OIDC_TIMEOUT,
            verify=settings.OIDC_VERIFY_SSL,
            stream=True,
            allow_redirects=False,
        ) as response:
            response.raise_for_status()
            body = response.raw.read(MAX_DOCUMENT_BYTES + 1, decode_content=True)
    except requests.RequestException as error:
        log.warning("OIDC discovery at %s failed: %s", url, error.__class__.__name__)
        raise ProviderUnavailable(f"The identity provider at {issuer} cannot be reached.") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ProviderUnavailable(f"{url} is larger than {MAX_DOCUMENT_BYTES} bytes.")
    try:
        document = json.loads(body)
    except ValueError:
        raise ProviderUnavailable(f"{url} is not JSON.") from None
    # OpenID Connect Discovery 1.0 §4.3: a document for another issuer is an attack
    # (or a wrong URL), and its keys must not be trusted.
    if not isinstance(document, dict) or document.get("issuer", "").rstrip("/") != issuer:
        raise ProviderUnavailable(f"{url} describes another issuer.")
    return document


def _endpoint(name: str) -> str:
    value = metadata().get(name)
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise ProviderUnavailable(f"The identity provider's discovery document has no {name}.")
    return value


endpoint = lazy(_endpoint, str)


def forget() -> None:
    """Drops the cached documents (tests; a provider that moved its endpoints)."""
    with _lock:
        _cache.clear()
