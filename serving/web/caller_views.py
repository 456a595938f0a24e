"""Who may call what, on the pages: inference keys (yours, and a department's),
grants asked from a department's page and decided on the adapter's page.

Reads go through serving.caller_selectors, every write through one service
with the viewer's Actor; a NotFound is the 404 page, other refusals are shown
beside the form or as a message."""

from __future__ import annotations

from typing import cast

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from core import selectors as core_selectors
from core.access import can_approve, can_review, can_see
from core.actors import Actor
from core.errors import ApplicationError, NotFound
from core.web import errors_on, page, safe_next
from registry.models import Adapter
from registry.web.queries import my_departments
from serving import caller_selectors
from serving.models import GrantStatus
from serving.quota_selectors import department_budgets, department_limits_of
from serving.services.grants import (
    can_decide,
    can_revoke,
    grant_decide,
    grant_request,
    grant_revoke,
)
from serving.services.inference_keys import (
    inference_key_issue,
    inference_key_revoke,
    may_issue,
    may_revoke,
)
from serving.services.limits import can_set_key_limits, inference_key_limits_set
from serving.web.forms import GrantDecisionForm, GrantRequestForm, InferenceKeyForm


def _key_rows(actor: Actor, keys) -> list[dict]:
    return [
        {
            "key": key,
            "limited": key.requests_per_minute or key.tokens_per_minute,
            "may_set_limits": key.revoked_at is None and can_set_key_limits(actor, key),
            "status": caller_selectors.key_status(key),
            "may_revoke": key.revoked_at is None and may_revoke(actor, key),
        }
        for key in keys
    ]


def _issue(request, actor: Actor, form: InferenceKeyForm, context: dict) -> int:
    """Issues the key the form asks for; the secret goes into the context once."""
    if not form.is_valid():
        return 400
    data = form.cleaned_data
    department = core_selectors.department_get(actor, data["department"])
    account = None
    if data["holder"] == "service_account":
        name = data.get("service_account", "").strip()
        account = department.service_accounts.filter(name=name).first()
        if account is None:
            form.add_error("service_account", f"{department.slug} has no such service account.")
            return 400
    with errors_on(form) as outcome:
        key, secret = inference_key_issue(
            actor=actor,
            department=department,
            name=data["name"],
            expires_in_days=data["expires_in_days"],
            holder=data["holder"],
            service_account=account,
        )
    if outcome.failed:
        return outcome.status
    context.update(new_key=key, new_secret=secret)
    return 201


def _personal(form: InferenceKeyForm) -> InferenceKeyForm:
    """Your own page issues keys you hold; a department's and its accounts' are
    issued on the department's page."""
    cast(forms.ChoiceField, form.fields["holder"]).choices = [("person", "Me (ends when I leave)")]
    form.fields["holder"].widget = forms.HiddenInput()
    form.fields["holder"].initial = "person"
    del form.fields["service_account"]
    return form


def _keys_response(request, context: dict, status: int):
    response = render(request, "serving/keys.html", context, status=status)
    # A new key's secret is on this page once; keep it out of every cache.
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@page
def my_keys(request, actor: Actor):
    """Your own keys, in every department you belong to."""
    if actor.token is not None:
        raise Http404
    departments = [row.department for row in my_departments(actor)]
    form = _personal(InferenceKeyForm(request.POST or None, departments=departments))
    context: dict = {"department": None, "departments": departments}
    status = 200
    if request.method == "POST":
        status = _issue(request, actor, form, context)
        if status == 201:
            form = _personal(InferenceKeyForm(departments=departments))
    keys = caller_selectors.inference_keys_for(actor).filter(person=actor.user)
    context.update(form=form, keys=_key_rows(actor, keys[:200]))
    return _keys_response(request, context, status)


@require_http_methods(["GET", "POST"])
@page
def department_keys(request, actor: Actor, slug: str):
    """A department's keys (its approvers see them all, a member their own) and
    its grants, asked and held; members ask for a grant here."""
    department = core_selectors.department_get(actor, slug)
    if actor.token is not None:
        raise Http404
    form = InferenceKeyForm(
        request.POST if "issue" in request.POST else None,
        departments=[department],
        initial={"department": department.slug, "holder": "person"},
    )
    _for_department(form, actor, department)
    grant_form = GrantRequestForm(request.POST if "ask" in request.POST else None)
    context: dict = {"department": department}
    status = 200
    if request.method == "POST" and "issue" in request.POST:
        status = _issue(request, actor, form, context)
        if status == 201:
            form = InferenceKeyForm(
                departments=[department], initial={"department": department.slug}
            )
            _for_department(form, actor, department)
    elif request.method == "POST" and "ask" in request.POST:
        status = 400
        if grant_form.is_valid():
            data = grant_form.cleaned_data
            with errors_on(grant_form, {"bad_served_name": "served_name"}) as outcome:
                grant = grant_request(
                    actor=actor,
                    department=department,
                    served_name=data["served_name"].strip(),
                    expires_in_days=data["expires_in_days"],
                    reason=data["reason"],
                )
            status = outcome.status
            if not outcome.failed:
                messages.success(
                    request,
                    # The same words whether or not an adapter has the name
                    # (serving/services/grants.py): nothing of its department.
                    f"Asked for grant #{grant.pk}: {department.name} to call "
                    f"{grant.served_name}. An approver of the adapter's department decides.",
                )
                return redirect("serving:department-keys", slug=department.slug)
    keys = caller_selectors.inference_keys_for(actor).filter(department=department)
    grants = caller_selectors.grants_for(actor).filter(department=department)
    context.update(
        form=form,
        grant_form=grant_form,
        keys=_key_rows(actor, keys[:200]),
        grants=_grant_rows(actor, grants[:100]),
        approves=can_approve(actor, department.pk),
        **_limits_context(department),
    )
    return _keys_response(request, context, status)


def _limits_context(department) -> dict:
    """The department's limits and what is left of its token budgets."""
    limits = department_limits_of(department)
    return {
        "limits": limits,
        "has_limits": any(vars(limits).values()),
        "budgets": department_budgets(department.slug, limits),
    }


def _for_department(form: InferenceKeyForm, actor: Actor, department) -> None:
    """The department is the page's; a member may only hold a key themselves."""
    form.fields["department"].widget = forms.HiddenInput()
    if not may_issue(actor, department.pk, "department"):
        cast(forms.ChoiceField, form.fields["holder"]).choices = [
            ("person", "Me (ends when I leave)")
        ]


@require_POST
@page
def key_revoke_view(request, actor: Actor, pk: int):
    key = caller_selectors.inference_key_get(actor, pk) if actor.token is None else None
    if key is None:
        raise Http404
    try:
        inference_key_revoke(actor=actor, key=key, reason=request.POST.get("reason", ""))
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Revoked key {key.name} ({key.prefix}…).")
    return redirect(safe_next(request, reverse("serving:my-keys")))


def _limit(value: str) -> int | None:
    """A limit from the page's field: empty is no limit; anything else must be
    a whole number (the service says which are in bounds)."""
    value = (value or "").strip().replace(",", "")
    if not value:
        return None
    if not value.isdigit():
        raise ApplicationError(f"{value!r} is not a whole number.", code="bad_limit")
    return int(value)


@require_POST
@page
def key_limits_view(request, actor: Actor, pk: int):
    """An approver sets a key's own limits from the department's keys page."""
    key = caller_selectors.inference_key_get(actor, pk) if actor.token is None else None
    if key is None:
        raise Http404
    try:
        changes = {
            name: _limit(request.POST.get(name, ""))
            for name in ("requests_per_minute", "tokens_per_minute")
        }
        inference_key_limits_set(actor=actor, key=key, changes=changes)
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, f"Key {key.name}: {error.message}")
    else:
        messages.success(request, f"Limits of key {key.name} ({key.prefix}…) set.")
    fallback = reverse("serving:department-keys", args=[key.department.slug])
    return redirect(safe_next(request, fallback))


def _grant_rows(actor: Actor, grants) -> list[dict]:
    rows = []
    for grant in grants:
        asked = grant.status == GrantStatus.REQUESTED
        adapter = grant.adapter
        rows.append(
            {
                "grant": grant,
                "adapter_department": caller_selectors.adapter_department_shown(actor, grant),
                "may_decide": asked and can_decide(actor, grant),
                "four_eyes": asked
                and adapter is not None
                and not can_review(actor, grant.authors)
                and can_approve(actor, adapter.department_id),
                "may_revoke": grant.status == GrantStatus.APPROVED and can_revoke(actor, grant),
            }
        )
    return rows


def adapter_access_panel(actor: Actor, adapter: Adapter) -> dict:
    """The adapter page's card: who may call it and why, and its grants with
    what this viewer may do about each."""
    if not can_see(actor, adapter.department_id):
        return {"visible": False}
    grants = caller_selectors.live_grants_of(adapter)
    return {
        "visible": True,
        "adapter": adapter,
        "callers": caller_selectors.adapter_callers(adapter, grants),
        "grants": _grant_rows(actor, grants),
    }


@require_POST
@page
def grant_decide_view(request, actor: Actor, pk: int):
    grant = caller_selectors.grant_get(actor, pk)
    form = GrantDecisionForm(request.POST)
    if not form.is_valid():
        raise Http404("Unknown decision.")
    decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"]
    try:
        if decision == "revoke":
            grant_revoke(actor=actor, grant=grant, comment=comment)
        else:
            grant_decide(actor=actor, grant=grant, approve=decision == "approve", comment=comment)
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, f"Grant #{grant.pk}: {error.message}")
    else:
        done = {"approve": "Approved", "refuse": "Refused", "revoke": "Revoked"}[decision]
        messages.success(
            request,
            f"{done} grant #{grant.pk}: {grant.department.name} to call {grant.served_name}.",
        )
    fallback = (
        reverse("web:adapter", args=[grant.adapter_id])
        if grant.adapter is not None and can_see(actor, grant.adapter.department_id)
        else reverse("serving:department-keys", args=[grant.department.slug])
    )
    return redirect(safe_next(request, fallback))
