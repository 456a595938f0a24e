"""Checking a registry webhook's signature on the receiver's side (the header
X-LoRA-Registry-Signature: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`).
Standard library only, so a receiver can copy it."""

from __future__ import annotations

import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300


def verify_signature(
    secret: str, body: bytes, header: str, *, tolerance: int = TOLERANCE_SECONDS, now=None
) -> bool:
    """True if one of the header's v1 signatures is the body's under `secret`
    and its timestamp is within `tolerance` seconds of now (no replay later)."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = hmac.new(
        secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))
