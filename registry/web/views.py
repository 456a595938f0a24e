"""Server-rendered pages for department owners and approvers.

Each view reads through registry.selectors (or registry.web.queries, which
starts from them) and writes through one registry service with the viewer's
Actor: the same rules as the REST API, checked in the same places. A NotFound
from either becomes the 404 page, so outsiders learn nothing about a
department's adapters. Other application errors are shown next to the form
that caused them.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core import selectors as core_selectors
from core.access import can_contribute
from core.actors import Actor
from core.body_limit import accepts_large_body
from core.csrf import csrf_before_body
from core.errors import ApplicationError, NotFound
from core.models import Ability
from core.redaction import redact
from core.services.tokens import token_create, token_revoke
from core.web import errors_on, page, paginate, safe_next
from registry import selectors
from registry.artifact_store import get_artifact_store
from registry.ingest.incoming import UploadedFiles
from registry.ingest.streamed import install_streaming_handler
from registry.lineage import run_ui_url
from registry.models import AdapterVersion
from registry.services.adapters import adapter_create
from registry.services.versions import (
    ingest_limits,
    version_prefix,
    version_register,
    version_transition,
)
from registry.web import queries
from registry.web.actions import version_actions
from registry.web.forms import (
    AdapterCreateForm,
    TokenCreateForm,
    TransitionForm,
    UploadVersionForm,
)

PAST_TENSE = {
    "submit": "submitted for review",
    "approve": "approved",
    "reject": "rejected",
    "deprecate": "deprecated",
    "archive": "archived",
}


# --- Dashboard and activity -------------------------------------------------


@require_GET
@page
def dashboard(request, actor: Actor):
    departments = queries.my_departments(actor)
    adapters = paginate(request, selectors.adapters_for(actor), 20)
    context = {
        "departments": departments,
        "adapters": adapters,
        "pending_count": selectors.pending_reviews_for(actor).count(),
        "activity": core_selectors.audit_events_for(actor)[:8],
    }
    return render(request, "registry/dashboard.html", context)


@require_GET
@page
def activity(request, actor: Actor):
    events = paginate(request, core_selectors.audit_events_for(actor), 50)
    return render(request, "registry/activity.html", {"events": events})


# --- Adapters ---------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@page
def adapter_new(request, actor: Actor):
    departments = [row.department for row in queries.my_departments(actor)]
    form = AdapterCreateForm(request.POST or None, departments=departments)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            with errors_on(form, {"owner_not_found": "owners"}) as outcome:
                adapter = adapter_create(
                    actor=actor,
                    department=core_selectors.department_get(actor, data["department"]),
                    name=data["name"],
                    base_model=data["base_model"],
                    description=data["description"],
                    served_name=data["served_name"] or None,
                    owners=data["owners"] or None,
                )
            if not outcome.failed:
                messages.success(request, f"Created adapter {adapter.name}.")
                return redirect("web:adapter", pk=adapter.pk)
            status = outcome.status
        else:
            status = 400
    return render(request, "registry/adapter_new.html", {"form": form}, status=status)


def _adapter_context(request, actor: Actor, adapter, upload_form=None, upload_error=""):
    versions = paginate(request, queries.adapter_versions(actor, adapter), 20)
    return {
        "adapter": adapter,
        "versions": versions,
        "can_upload": can_contribute(actor, adapter.department_id, Ability.REGISTER_VERSIONS),
        "upload_form": upload_form or UploadVersionForm(),
        "upload_error": upload_error,
    }


@require_GET
@page
def adapter_detail(request, actor: Actor, pk: int):
    adapter = selectors.adapter_get(actor, pk)
    return render(
        request, "registry/adapter_detail.html", _adapter_context(request, actor, adapter)
    )


@accepts_large_body
@csrf_before_body
@require_POST
@page
def version_upload(request, actor: Actor, pk: int):
    adapter = selectors.adapter_get(actor, pk)
    # Set up before the body is read: the files stream into the store as they
    # arrive (the CSRF token came in the header, see core.csrf). Someone who may
    # not register gets the service's refusal, as before, without streaming.
    streaming = None
    if can_contribute(actor, adapter.department_id, Ability.REGISTER_VERSIONS):
        streaming = install_streaming_handler(
            request,
            prefix=version_prefix(adapter),
            store=get_artifact_store(),
            limits=ingest_limits(),
            staging_root=settings.INGEST_STAGING_DIR,
        )
    form, error, status, result = None, "", 400, None
    try:
        form = UploadVersionForm(request.POST, request.FILES)
        if form.is_valid():
            uploads = form.cleaned_data["files"]
            streamed = streaming.artifact(uploads) if streaming is not None else None
            result = version_register(
                actor=actor, adapter=adapter, source=streamed or UploadedFiles(uploads)
            )
    except NotFound:
        raise
    except ApplicationError as failure:
        error = failure.message if failure.public else redact(failure.message)
        status = failure.status
    finally:
        if streaming is not None:
            if result is None or not result.created:
                streaming.discard()
            streaming.close()
    if result is not None:
        version = result.version
        messages.success(request, f"Registered version {version.number}.")
        for warning in result.warnings:
            messages.warning(request, warning)
        target = reverse("web:version", args=[version.pk])
        if request.htmx:
            return HttpResponse(status=204, headers={"HX-Redirect": target})
        return redirect(target)
    form = form or UploadVersionForm()
    if request.htmx:
        # 422 is the one error status htmx is configured to swap into the page.
        context = {"adapter": adapter, "upload_form": form, "upload_error": error}
        return render(request, "registry/partials/upload_form.html", context, status=422)
    context = _adapter_context(request, actor, adapter, form, error)
    return render(request, "registry/adapter_detail.html", context, status=status)


# --- Versions ---------------------------------------------------------------


def version_page_context(request, actor: Actor, version: AdapterVersion) -> dict:
    trail = paginate(request, queries.version_audit_trail(actor, version), 50)
    return {
        "version": version,
        "adapter": version.adapter,
        "trail": trail,
        "actions": version_actions(actor, version),
        "config_items": [(k, json.dumps(v)) for k, v in sorted(version.adapter_config.items())],
        "run_url": run_ui_url(version.mlflow_experiment_id, version.mlflow_run_id)
        or version.mlflow_run_uri,
        "run_metrics": sorted((version.run_metrics or {}).items()),
        # Where the store keeps it (a file:// or s3:// URI) is the platform's, not a department's.
        "sees_storage": actor.is_platform_admin,
    }


@require_GET
@page
def version_detail(request, actor: Actor, pk: int):
    version = selectors.version_get(actor, pk)
    return render(
        request, "registry/version_detail.html", version_page_context(request, actor, version)
    )


@require_POST
@page
def version_action(request, actor: Actor, pk: int):
    version = selectors.version_get(actor, pk)
    form = TransitionForm(request.POST)
    if not form.is_valid():
        raise Http404("Unknown action.")
    action = form.cleaned_data["action"]
    try:
        version = version_transition(
            actor=actor, version=version, action=action, comment=form.cleaned_data["comment"]
        )
    except NotFound:
        raise
    except ApplicationError as error:
        context = version_page_context(request, actor, version)
        context.update(action_error=error.message, failed_action=action, form=form)
        return render(request, "registry/version_detail.html", context, status=error.status)
    messages.success(
        request,
        f"{version.adapter.name} v{version.number} {PAST_TENSE.get(action, action)}.",
    )
    return redirect(safe_next(request, reverse("web:version", args=[version.pk])))


# --- Review queue -----------------------------------------------------------


# (label, field, how the template shows it)
DIFF_FIELDS = (
    ("Rank (r)", "r", "plain"),
    ("LoRA alpha", "lora_alpha", "plain"),
    ("Target modules", "target_modules", "modules"),
    ("Size", "total_size", "size"),
    ("Parameters", "parameter_count", "count"),
    ("Est. memory", "estimated_memory_bytes", "size"),
    ("Base model", "base_model_name_or_path", "plain"),
)


def _diff_rows(candidate: AdapterVersion, current: AdapterVersion | None) -> list[dict]:
    rows = []
    for label, field, kind in DIFF_FIELDS:
        new = getattr(candidate, field)
        old = getattr(current, field) if current else None
        if kind == "modules":
            new = sorted(new)
            old = sorted(getattr(current, field)) if current else None
        rows.append(
            {
                "label": label,
                "kind": kind,
                "new": new,
                "old": old,
                "changed": current is not None and new != old,
            }
        )
    return rows


def _metric_rows(candidate: AdapterVersion, current: AdapterVersion | None) -> list[dict]:
    """Training metrics from the MLflow run snapshots, side by side."""
    new_metrics = candidate.run_metrics or {}
    old_metrics = (current.run_metrics or {}) if current else {}
    return [
        {
            "label": name,
            "new": new_metrics.get(name),
            "old": old_metrics.get(name),
            "changed": current is not None and new_metrics.get(name) != old_metrics.get(name),
        }
        for name in sorted(set(new_metrics) | set(old_metrics))
    ]


@require_GET
@page
def review_queue(request, actor: Actor):
    pending = paginate(request, selectors.pending_reviews_for(actor), 10)
    current = queries.approved_versions_by_adapter(actor, {v.adapter_id for v in pending})
    reviews = []
    for version in pending:
        approved = current.get(version.adapter_id)
        new_modules = set(version.target_modules)
        old_modules = set(approved.target_modules) if approved else set()
        reviews.append(
            {
                "version": version,
                "current": approved,
                "diff": _diff_rows(version, approved),
                "metrics": _metric_rows(version, approved),
                "modules_added": sorted(new_modules - old_modules) if approved else [],
                "modules_removed": sorted(old_modules - new_modules),
                "actions": version_actions(actor, version),
            }
        )
    context = {"pending": pending, "reviews": reviews, "pending_count": pending.paginator.count}
    return render(request, "registry/review_queue.html", context)


# --- API tokens -------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@page
def tokens(request, actor: Actor):
    departments = [row.department for row in queries.my_departments(actor)]
    form = TokenCreateForm(request.POST or None, departments=departments)
    context: dict = {"form": form}
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            with errors_on(form) as outcome:
                token, secret = token_create(
                    actor=actor,
                    department=core_selectors.department_get(actor, data["department"]),
                    name=data["name"],
                    abilities=data["abilities"],
                    expires_in_days=data["expires_in_days"],
                )
            status = outcome.status
            if not outcome.failed:
                context.update(
                    new_token=token,
                    new_secret=secret,
                    form=TokenCreateForm(departments=departments),
                )
                status = 201
    context["tokens"] = paginate(request, core_selectors.tokens_for(actor), 20)
    response = render(request, "registry/tokens.html", context, status=status)
    # The secret is on this page once; keep it out of every cache.
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@page
def token_revoke_view(request, actor: Actor, pk: int):
    token = core_selectors.token_get(actor, pk)
    try:
        token_revoke(actor=actor, token=token)
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Revoked token {token.name} ({token.prefix}…).")
    return redirect("web:tokens")
