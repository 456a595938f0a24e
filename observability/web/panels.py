"""Panels other apps' pages show (registered in ObservabilityConfig.ready)."""

from __future__ import annotations

from django.conf import settings

from observability.selectors import adapter_usage


def adapter_usage_panel(actor, adapter) -> dict:
    """The adapter page's "Usage" card. The page has already checked that the
    viewer may see the adapter; deployment names are visible to everyone signed in."""
    return {
        "template": "observability/partials/adapter_usage.html",
        "rows": adapter_usage(adapter),
        "idle_days": settings.OBSERVABILITY_IDLE_DAYS,
    }
