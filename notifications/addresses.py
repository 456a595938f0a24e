"""Where the server may send webhooks: a public address, unless a platform
admin allowed internal ones for a webhook. The rule the registry applies to
every server-side fetch a member can aim (registry/source_policy.py): a member
must not make the server reach what only the server can reach (metadata
services, the database, the replicas)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from core.errors import NotAuthorized, ValidationFailed


class AddressNotAllowed(NotAuthorized):
    code = "webhook_url_not_allowed"
    public = True  # names only the caller's own URL


def check_url(url: str, *, allow_internal: bool) -> None:
    """Raises a 4xx naming the rule if the URL may not be called; resolves the
    host (every address it resolves to must be public)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationFailed(
            "A webhook URL must be an http:// or https:// URL with a host.", code="bad_webhook_url"
        )
    if parts.username or parts.password:
        raise ValidationFailed(
            "A webhook URL must not carry credentials; the signature authenticates.",
            code="bad_webhook_url",
        )
    if allow_internal:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise ValidationFailed(
            f"The host {parts.hostname!r} does not resolve.", code="bad_webhook_url"
        ) from None
    for info in infos:
        # An IPv6 link-local address carries its zone ("fe80::1%eth0").
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            raise AddressNotAllowed(
                f"{parts.hostname} resolves to {address}, an internal address. Webhooks go "
                "to public addresses; a platform admin may allow internal ones for a webhook."
            )
