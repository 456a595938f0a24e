"""The webhook signature, Stripe's scheme: `t=<unix seconds>,v1=<hex HMAC-SHA256
of "<t>." + body>` under the webhook's secret. Receivers check it with
`verify` (or `lora-registry webhook verify`) and refuse a timestamp older than
their tolerance, so a captured delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-LoRA-Registry-Signature"
TOLERANCE_SECONDS = 300


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def verify(secret: str, body: bytes, header: str, *, tolerance: int = TOLERANCE_SECONDS) -> bool:
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        parts.setdefault(key, []).append(value)
    try:
        t = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - t) > tolerance:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, given) for given in parts.get("v1", []))
