"""Small presentation helpers for the web UI: times, status badges, sizes and counts."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.conf import settings
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def when(value: datetime | None) -> str:
    """A <time> element with the date, time and zone ("2026-12-03 06:12 UTC"),
    and "3 minutes ago" on hover: a time without its date or zone is ambiguous
    once people read it from another day or place."""
    if value is None:
        return mark_safe('<span class="muted">—</span>')  # noqa: S308 - a constant
    local = timezone.localtime(value)
    shown = local.strftime("%Y-%m-%d\xa0%H:%M\xa0%Z")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), naturaltime(value), shown
    )


@register.simple_tag
def currency() -> str:
    return settings.COST_CURRENCY


@register.filter
def money(value: float | None, how: str = "") -> str:
    """2919.53 -> "USD 2,919.53" in COST_CURRENCY; `money:"abs"` drops the sign
    (for a sentence that already says "more")."""
    if value is None:
        return "—"
    amount = abs(value) if how == "abs" else value
    sign = "\u2212" if amount < 0 else ""
    return f"{sign}{settings.COST_CURRENCY}\xa0{abs(amount):,.2f}"


@register.filter
def status_badge(status: str, label: str | None = None) -> str:
    text = label or status.replace("_", " ").capitalize()
    return format_html('<span class="badge badge-{}">{}</span>', status, text)


@register.filter
def size(value: int | None) -> str:
    """Bytes in binary units, labelled as such: Django's filesizeformat divides by
    1024 but prints "GB", which made 40 GiB of GPU memory read as 40 GB."""
    if value is None:
        return "—"
    # A no-break space, as filesizeformat had: a figure never wraps apart from its unit.
    if abs(value) < 1024:
        return f"{value}\xa0bytes"
    amount = float(value)
    for unit in ("KiB", "MiB", "GiB"):
        amount /= 1024
        if abs(amount) < 1024:
            return f"{amount:.1f}\xa0{unit}"
    return f"{amount / 1024:.1f}\xa0TiB"


@register.filter
def compact(value: int | None) -> str:
    """1234567 -> 1.2M: parameter counts read at a glance."""
    if value is None:
        return "—"
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return str(value)


@register.filter
def percent(value: float | None) -> str:
    """0.0213 -> 2.1 %: an error rate (a fraction) as people read it."""
    if value is None:
        return "—"
    return f"{100 * value:.1f}\xa0%"


@register.filter
def get_item(mapping: dict, key):
    return mapping.get(key) if mapping else None


@register.filter
def http_url(value: str) -> str:
    """The URL if it is http(s), else "": lineage URIs come from pipelines, and a
    javascript: link must never reach an href."""
    value = (value or "").strip()
    return value if value.lower().startswith(("http://", "https://")) else ""


EVENT_LABELS = {
    "version.registered": "registered",
    "version.submit": "submitted for review",
    "version.approve": "approved",
    "version.reject": "rejected",
    "version.deprecate": "deprecated",
    "version.archive": "archived",
    "version.artifacts_deleted": "deleted the files of",
    "adapter.created": "created adapter",
    "adapter.updated": "updated adapter",
    "token.created": "created API token",
    "token.revoked": "revoked API token",
    "membership.added": "added a member to",
    "membership.changed": "changed a member's role in",
    "membership.removed": "removed a member from",
    "department.created": "created department",
    "department.updated": "updated department",
    "promotion.requested": "asked to promote",
    "promotion.approve": "approved the promotion of",
    "promotion.reject": "rejected the promotion of",
    "rollout.promote": "started promoting",
    "rollout.swap": "started swapping in",
    "rollout.rollback": "started rolling back",
    "rollout.retire": "started retiring",
    "rollout.succeeded": "finished rolling out",
    "rollout.failed": "saw a rollout fail:",
    "rollout.rolled_back": "saw a rollout undone:",
    "rollout.cancelled": "cancelled the rollout of",
    "rollout.canary_started": "started a canary of",
    "rollout.canary_promote_requested": "asked to promote the canary of",
    "rollout.canary_abort_requested": "asked to abort the canary of",
    "rollout.canary_switched_back": "switched traffic back from the canary of",
    "placement.bounds_set": "set how many replicas hold",
    "inference_key.issued": "issued an inference key",
    "inference_key.revoked": "revoked an inference key",
    "service_account.created": "created service account",
    "service_account.deactivated": "deactivated service account",
}


@register.filter
def event_label(action: str) -> str:
    """ "version.approve" -> "approved": the verb of a sentence "<who> <verb>
    <object>". Actions without a label read as words ("grant.requested" ->
    "grant requested"), never as a code."""
    if action in EVENT_LABELS:
        return EVENT_LABELS[action]
    return (action or "").replace(".", " ").replace("_", " ")


@register.filter
def state_label(state: str) -> str:
    return (state or "").replace("_", " ")


@register.filter
def summary_line(text: str, limit: int = 120) -> str:
    """An error's last line (where Python and vLLM put the message), cut to one
    line; the raw text goes behind "Details"."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
