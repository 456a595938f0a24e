"""What the limits at the front doors need from the database: each live key's
and each department's limits (two queries), and the metered tokens they are
compared to (`metered_tokens`, from metering). The pure side is
serving/rules/quotas.py."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from django.db.models import Q
from django.utils import timezone

from core.models import Department
from serving.models import DepartmentLimits
from serving.rules.quotas import (
    BudgetLeft,
    DepartmentLimitsView,
    KeyLimits,
    Limited,
    budgets_left,
    limited_callers,
)
from serving.token_usage import Per, metering_available, tokens_used


def metered_tokens(scope: str, since: datetime, until: datetime) -> dict | None:
    """Tokens (prompt plus completion) per key id (`scope` "key") or per
    department slug ("department") of requests metered since `since` (up to now:
    `until` is the moment the windows were computed for), on every deployment,
    as vLLM counted them (serving.token_usage, read by observability's metering).
    None where nothing meters tokens: unknown, which limits nobody."""
    if not metering_available():
        return None
    used = tokens_used(cast(Per, scope), since)  # "key" or "department", as documented
    if scope == "key":
        return {key_id: row.tokens for key_id, row in used.items()}
    slugs = dict(Department.objects.filter(pk__in=list(used)).values_list("pk", "slug"))
    return {slugs[pk]: row.tokens for pk, row in used.items() if pk in slugs}


def department_limits() -> dict[str, DepartmentLimitsView]:
    """Every department's limits that set at least one, by slug."""
    return {
        row.department.slug: DepartmentLimitsView(
            requests_per_minute=row.requests_per_minute,
            tokens_per_minute=row.tokens_per_minute,
            tokens_per_day=row.tokens_per_day,
            tokens_per_month=row.tokens_per_month,
        )
        for row in DepartmentLimits.objects.select_related("department")
    }


def department_limits_of(department) -> DepartmentLimitsView:
    row = DepartmentLimits.objects.filter(department=department).first()
    if row is None:
        return DepartmentLimitsView()
    return DepartmentLimitsView(
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
        tokens_per_day=row.tokens_per_day,
        tokens_per_month=row.tokens_per_month,
    )


def key_limits(keys) -> dict[int, KeyLimits]:
    """The limits of these keys (a queryset of InferenceKey, the live ones)
    that set one, by id: one query."""
    rows = keys.filter(
        Q(requests_per_minute__isnull=False) | Q(tokens_per_minute__isnull=False)
    ).values("pk", "department__slug", "requests_per_minute", "tokens_per_minute")
    return {
        row["pk"]: KeyLimits(
            department=row["department__slug"],
            requests_per_minute=row["requests_per_minute"],
            tokens_per_minute=row["tokens_per_minute"],
        )
        for row in rows
    }


def limited_now(
    keys: dict[int, KeyLimits],
    departments: dict[str, DepartmentLimitsView],
    now: datetime | None = None,
    tokens=None,
) -> dict[str, Limited]:
    """Who the doors refuse now for tokens, from what metering counted."""
    return limited_callers(
        keys=keys,
        departments=departments,
        tokens=tokens or metered_tokens,
        now=now or timezone.now(),
    )


def department_budgets(slug: str, limits: DepartmentLimitsView, now=None) -> list[BudgetLeft]:
    """What is left of the department's token limits now (the keys page, the API)."""
    return budgets_left(slug, limits, metered_tokens, now or timezone.now())
