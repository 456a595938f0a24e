"""Limits at the front door, as pure values: what each door counts itself
(requests per minute, a stick table per door) and which callers it refuses
because metered tokens crossed a limit (tokens per minute, budgets per day and
month), computed here from "tokens per key and per department over a window".

The windows are calendar windows in UTC: the minute, the day, the month. A
window's end is when its refusal ends, so a 429 can say exactly when to retry.
Tokens are enforced after the fact (the request that crosses a limit completes,
as APISIX and LiteLLM do): the next ones are refused from the reconcile tick
that sees the crossing until the window ends. docs/door.md, "Limits".
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# The door's names for its callers in the `rpm` and `limited` maps. Slugs and
# ids hold no ':' (their patterns), so the two kinds never collide.
KEY_PREFIX = "key:"
DEPARTMENT_PREFIX = "dept:"

# Which limit a `limited` entry enforces: its word in the map and the 429's text.
TOKENS_PER_MINUTE = "tokens_per_minute"
TOKENS_PER_DAY = "tokens_per_day"
TOKENS_PER_MONTH = "tokens_per_month"


def key_entry(key_id: int) -> str:
    return f"{KEY_PREFIX}{key_id}"


def department_entry(slug: str) -> str:
    return f"{DEPARTMENT_PREFIX}{slug}"


@dataclass(frozen=True)
class Limited:
    """The door refuses this caller until `until` (epoch seconds): `limit`
    (which one) of `value` tokens was crossed in the window ending then."""

    until: int
    limit: str
    value: int


@dataclass(frozen=True)
class KeyLimits:
    department: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class DepartmentLimitsView:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None


# Tokens (prompt plus completion) per key id or per department slug between two
# instants: the one question quotas ask of metering. `scope` is "key" or
# "department"; None where nothing is metered (no answer, rather than zero).
TokensOver = Callable[[str, datetime, datetime], Mapping | None]


@dataclass(frozen=True)
class Windows:
    """The calendar windows (UTC) that hold `now`: each a (start, end)."""

    minute: tuple[datetime, datetime]
    day: tuple[datetime, datetime]
    month: tuple[datetime, datetime]

    @classmethod
    def at(cls, now: datetime) -> Windows:
        now = now.astimezone(UTC)
        minute = now.replace(second=0, microsecond=0)
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        month = day.replace(day=1)
        days = calendar.monthrange(month.year, month.month)[1]
        return cls(
            minute=(minute, minute + timedelta(minutes=1)),
            day=(day, day + timedelta(days=1)),
            month=(month, month + timedelta(days=days)),
        )


def door_rpm(
    keys: Mapping[int, KeyLimits], departments: Mapping[str, DepartmentLimitsView]
) -> dict[str, int]:
    """The door's `rpm` map: requests per minute per key and per department,
    only where there is a limit. A key's own limit is counted apart from its
    department's: a request is taken only while both have room."""
    rpm = {
        department_entry(slug): limits.requests_per_minute
        for slug, limits in departments.items()
        if limits.requests_per_minute
    }
    for key_id, limits in keys.items():
        if limits.requests_per_minute:
            rpm[key_entry(key_id)] = limits.requests_per_minute
    return rpm


def limited_callers(
    *,
    keys: Mapping[int, KeyLimits],
    departments: Mapping[str, DepartmentLimitsView],
    tokens: TokensOver,
    now: datetime,
) -> dict[str, Limited]:
    """The door's `limited` map: each key or department whose metered tokens
    in the current window reached one of its token limits, refused until that
    window ends. Where several are crossed, the one that ends last is kept.
    `tokens` is asked once per window and scope, and only where a limit of
    that kind exists; an unanswered question (None: no metering) limits nobody."""
    windows = Windows.at(now)
    found: dict[str, Limited] = {}

    def crossed(entry: str, used: int, limit: int | None, kind: str, end: datetime) -> None:
        if limit is None or used < limit:
            return
        candidate = Limited(until=int(end.timestamp()), limit=kind, value=limit)
        if entry not in found or found[entry].until < candidate.until:
            found[entry] = candidate

    def ask(scope: str, window: tuple[datetime, datetime], wanted: bool) -> Mapping:
        if not wanted:
            return {}
        return tokens(scope, window[0], now) or {}

    key_minute = ask("key", windows.minute, any(k.tokens_per_minute for k in keys.values()))
    for key_id, limits in keys.items():
        used = key_minute.get(key_id, 0)
        crossed(
            key_entry(key_id), used, limits.tokens_per_minute, TOKENS_PER_MINUTE, windows.minute[1]
        )
    for kind, window in (
        (TOKENS_PER_MINUTE, windows.minute),
        (TOKENS_PER_DAY, windows.day),
        (TOKENS_PER_MONTH, windows.month),
    ):
        used = ask("department", window, any(getattr(d, kind) for d in departments.values()))
        for slug, department_limits in departments.items():
            limit = getattr(department_limits, kind)
            crossed(department_entry(slug), used.get(slug, 0), limit, kind, window[1])
    return found


@dataclass(frozen=True)
class BudgetLeft:
    """What a department has left of a token limit in the current window."""

    limit: str
    value: int
    used: int | None  # None: nothing is metered yet
    resets_at: datetime

    @property
    def left(self) -> int | None:
        return None if self.used is None else max(self.value - self.used, 0)


def budgets_left(
    slug: str, limits: DepartmentLimitsView, tokens: TokensOver, now: datetime
) -> list[BudgetLeft]:
    """The department's token limits with what is left of each now (the keys page)."""
    windows = Windows.at(now)
    rows = []
    for kind, window in (
        (TOKENS_PER_MINUTE, windows.minute),
        (TOKENS_PER_DAY, windows.day),
        (TOKENS_PER_MONTH, windows.month),
    ):
        value = getattr(limits, kind)
        if not value:
            continue
        used = tokens("department", window[0], now)
        rows.append(
            BudgetLeft(
                limit=kind,
                value=value,
                used=None if used is None else int(used.get(slug, 0)),
                resets_at=window[1],
            )
        )
    return rows
