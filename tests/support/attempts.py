"""Attempt results made by hand, for tests of what reads them."""

from __future__ import annotations

from datetime import UTC, datetime

from serving.vllm_client import AttemptResult


def answered(body, *, ok: bool = True) -> AttemptResult:
    """A GET that a replica answered (ok) with `body`, or that failed (not ok)."""
    return AttemptResult(
        method="GET",
        url="http://replica/",
        started_at=datetime.now(UTC),
        duration_ms=1.0,
        status_code=200 if ok else None,
        ok=ok,
        error="" if ok else "ConnectionError",
        transient=not ok,
        body=body if ok else "",
    )
