"""Observability's parts of other apps' pages: the registry's adapter page and
serving's deployment page ask these tags; neither app imports observability."""

from __future__ import annotations

from django import template
from django.conf import settings

from observability.selectors import USAGE_PANEL_DAYS, adapter_usage, deployment_usage

register = template.Library()


@register.inclusion_tag("observability/partials/adapter_usage.html")
def adapter_usage_panel(adapter):
    """The adapter page's "Usage" card. The page has already checked that the
    viewer may see the adapter; deployment names are visible to everyone signed in."""
    return {
        "panel": {
            "rows": adapter_usage(adapter),
            "idle_days": settings.OBSERVABILITY_IDLE_DAYS,
            "usage_days": USAGE_PANEL_DAYS,
            "department": adapter.department.slug,
        }
    }


@register.simple_tag
def usage_by_adapter(deployment, rows):
    """{served name: what vLLM's metrics said of it} for the rows on a deployment page."""
    return deployment_usage(deployment, [row["served_name"] for row in rows])


@register.simple_tag
def idle_days():
    return settings.OBSERVABILITY_IDLE_DAYS
