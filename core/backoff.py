"""The one back-off formula: exponential, capped, with optional jitter (so the
work queued during an outage does not all come back at the same instant)."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, *, base: float, cap: float, jitter: bool = False) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first retry)."""
    delay = min(base * 2 ** min(max(attempt, 0), 30), cap)
    return delay * random.uniform(0.5, 1.0) if jitter else delay
