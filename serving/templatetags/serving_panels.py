"""Serving's parts of registry pages. The registry's views know nothing of
serving; its templates ask these tags, which read through serving's own
queries with the viewer's Actor (set on the request by core.web.page)."""

from __future__ import annotations

from django import template

from serving import selectors
from serving.web import queries

register = template.Library()


@register.simple_tag(takes_context=True)
def version_serving(context, version):
    """Where the version is served, "Promote to…" and its pending promotions."""
    from serving.web.views import version_panel

    return version_panel(context["request"].actor, version)


@register.simple_tag(takes_context=True)
def deployments_health(context):
    return queries.deployments_health(context["request"].actor)


@register.simple_tag
def served_where(versions):
    """{version id: names of the deployments meant to serve it}, in one query."""
    return queries.served_where([version.pk for version in versions])


@register.simple_tag(takes_context=True)
def adapter_standing(context, adapters):
    """{adapter id: Standing}: what each serves where beside its newest approved version."""
    return queries.adapter_standing(context["request"].actor, adapters)


@register.simple_tag(takes_context=True)
def standing_of(context, adapter):
    return queries.adapter_standing(context["request"].actor, [adapter])[adapter.pk]


@register.simple_tag(takes_context=True)
def adapter_access(context, adapter, standing):
    """A "How clients reach this" card's data for each deployment serving the
    adapter (`standing`: what standing_of said for it)."""
    actor = context["request"].actor
    names = [row.deployment for row in standing.live]
    if not names:
        return []
    deployments = selectors.deployments_for(actor).prefetch_related(None).filter(name__in=names)
    return [queries.client_access(actor, d, adapter.served_name) for d in deployments]


@register.simple_tag(takes_context=True)
def adapter_callers_panel(context, adapter):
    """Who may call the adapter at the front doors and why, and its grants."""
    from serving.web.caller_views import adapter_access_panel

    return adapter_access_panel(context["request"].actor, adapter)
