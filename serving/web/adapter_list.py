"""The Adapters page: every adapter the viewer may see, searchable, filtered by
department, base model, where it is served and how it stands, each with what
it serves beside its newest approved version.

It lives in serving because "served where" is serving's to know (registry
never imports serving); the adapters come from registry.selectors.adapters_for,
so an outsider's filters can never reach another department's adapters.
"""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Exists, F, Min, OuterRef, Q, Subquery
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core import selectors as core_selectors
from core.actors import Actor
from core.web import page, paginate
from registry import selectors as registry_selectors
from registry.models import Adapter, AdapterVersion, VersionStatus
from serving import selectors
from serving.models import ServedAdapter
from serving.web import queries

NOWHERE = "-"
STANDINGS = [
    ("live", "Served somewhere"),
    ("unpromoted", "Approved, not promoted"),
    ("pending_review", "Waiting for review"),
    ("unapproved", "Nothing approved yet"),
]


def _served(**filters):
    return ServedAdapter.objects.filter(adapter=OuterRef("pk"), version__isnull=False, **filters)


class AdapterFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    department = django_filters.ChoiceFilter(
        field_name="department__slug", label="Department", empty_label="All departments"
    )
    base_model = django_filters.ChoiceFilter(label="Base model", empty_label="Any base model")
    served = django_filters.ChoiceFilter(
        method="served_on", label="Served on", empty_label="Anywhere or nowhere"
    )
    standing = django_filters.ChoiceFilter(
        method="standing_is", label="Status", choices=STANDINGS, empty_label="Any status"
    )

    def __init__(self, data, queryset, *, actor: Actor):
        super().__init__(data, queryset=queryset)
        self.filters["department"].extra["choices"] = [
            (d.slug, d.name) for d in core_selectors.departments_for(actor).order_by("name")
        ]
        models = queryset.order_by().values_list("base_model", flat=True).distinct()
        self.filters["base_model"].extra["choices"] = [(m, m) for m in sorted(set(models))]
        deployments = selectors.deployments_for(actor).prefetch_related(None).order_by("name")
        self.filters["served"].extra["choices"] = [
            *((d.name, d.name) for d in deployments),
            (NOWHERE, "Nowhere"),
        ]
        # Bound: a search box is outside input.
        self.filters["q"].extra["max_length"] = 100

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(name__icontains=value)
            | Q(served_name__icontains=value)
            | Q(description__icontains=value)
        )

    def served_on(self, queryset, name, value):
        if value == NOWHERE:
            return queryset.exclude(Exists(_served()))
        return queryset.filter(Exists(_served(deployment__name=value)))

    def standing_is(self, queryset, name, value):
        if value == "live":
            return queryset.filter(Exists(_served()))
        if value == "pending_review":
            waiting = AdapterVersion.objects.filter(
                adapter=OuterRef("pk"), status=VersionStatus.PENDING_REVIEW
            )
            return queryset.filter(Exists(waiting))
        approved = Subquery(
            AdapterVersion.objects.filter(adapter=OuterRef("pk"), status=VersionStatus.APPROVED)
            .order_by("-number")
            .values("number")[:1]
        )
        # The oldest version any deployment serves: below the approved one, some
        # deployment still waits for a promotion.
        oldest_live = Subquery(
            _served()
            .order_by()
            .values("adapter")
            .annotate(low=Min("version__number"))
            .values("low")[:1]
        )
        queryset = queryset.annotate(approved_number=approved, live_number=oldest_live)
        if value == "unapproved":
            return queryset.filter(approved_number__isnull=True)
        return queryset.filter(approved_number__isnull=False).filter(
            Q(live_number__isnull=True) | Q(approved_number__gt=F("live_number"))
        )

    class Meta:
        model = Adapter
        fields = ["q", "department", "base_model", "served", "standing"]
        form = forms.Form


@require_GET
@page
def adapter_list(request, actor: Actor):
    visible = registry_selectors.adapters_for(actor)
    found = AdapterFilter(request.GET, visible, actor=actor)
    # django-filter drops an invalid filter and lists everything; a filter that
    # names nothing the viewer has (a typed department) matches nothing instead.
    rows = found.qs if found.is_valid() else visible.none()
    adapters = paginate(request, rows.order_by("department__name", "name"), 25)
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "filter": found,
        "adapters": adapters,
        "standing": queries.adapter_standing(actor, adapters),
        "filtered": any(request.GET.get(name) for name in AdapterFilter.Meta.fields),
        "query_prefix": f"{query.urlencode()}&" if query else "",
    }
    return render(request, "serving/adapters.html", context)
