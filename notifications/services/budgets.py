"""Token budgets at 80 % and 100 %: a department that has used that much of
its day's or month's token budget is told once per budget, window and
threshold, by a periodic task. The usage is what the doors enforce from
(serving.quota_selectors: metered tokens per department over the calendar
window); where nothing meters tokens nothing is told, as nothing is refused."""

from __future__ import annotations

from django.utils import timezone

from core.models import Department
from notifications.events import Draft, budget_draft
from notifications.services.outbox import events_record_once

THRESHOLDS = (80, 100)


def budgets_record(now=None) -> int:
    """Records the budget events not told yet; returns how many."""
    from serving.quota_selectors import department_limits, metered_tokens
    from serving.rules.quotas import TOKENS_PER_DAY, TOKENS_PER_MONTH, Windows

    now = now or timezone.now()
    limits = department_limits()
    windows = Windows.at(now)
    departments = {d.slug: d for d in Department.objects.filter(slug__in=list(limits))}
    candidates: list[tuple[list[str], str, Draft]] = []
    for limit, window in ((TOKENS_PER_DAY, windows.day), (TOKENS_PER_MONTH, windows.month)):
        wanted = {
            slug: value
            for slug, view in limits.items()
            if (value := getattr(view, limit)) and slug in departments
        }
        if not wanted:
            continue
        used = metered_tokens("department", window[0], now)
        if used is None:
            return 0  # nothing meters tokens: unknown, as for the doors
        for slug, value in wanted.items():
            spent = int(used.get(slug, 0))
            crossed = [t for t in THRESHOLDS if spent * 100 >= value * t]
            if not crossed:
                continue
            department = departments[slug]
            prefix = f"budget:{department.pk}:{limit}:{window[0].isoformat()}"
            # Only the highest threshold crossed is told: a department that went
            # from 70 % to 100 % in one window hears "all of it", not both.
            top = crossed[-1]
            higher = [f"{prefix}:{t}" for t in THRESHOLDS if t >= top]
            draft = budget_draft(
                department, limit=limit, value=value, used=spent, threshold=top, window=window
            )
            candidates.append((higher, f"{prefix}:{top}", draft))
    if not candidates:
        return 0
    from notifications.models import Event

    told = set(
        Event.objects.filter(
            dedupe_key__in=[k for keys, _, _ in candidates for k in keys]
        ).values_list("dedupe_key", flat=True)
    )
    return events_record_once(
        [(key, draft) for keys, key, draft in candidates if not told.intersection(keys)]
    )
