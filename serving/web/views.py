"""Server-rendered serving pages: deployments, promoting a version (gate
first), reviewing promotion requests, and the live rollout page.

Same shape as registry.web.views: reads go through serving.selectors (via
serving.web.queries) and every write through one serving service with the
viewer's Actor, so department isolation and four-eyes are the services' own.
A NotFound becomes the 404 page; other application errors are shown next to
what caused them.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.access import approver_department_ids, can_approve, can_promote, can_review
from core.actors import Actor
from core.errors import ApplicationError, NotFound
from core.models import Ability
from core.web import page, safe_next
from registry import selectors as registry_selectors
from registry.models import AdapterVersion, VersionStatus
from registry.web.views import version_page_context
from serving import kserve, selectors
from serving.attestation import quarantine_reason
from serving.deploy_access import deploy_refusal
from serving.fact_readings import disputes as fact_disputes
from serving.gate import evaluate_gate
from serving.models import (
    CanaryOutcome,
    CanaryRequest,
    PromotionStatus,
    Rollout,
    RolloutStatus,
    ServedAdapter,
)
from serving.services.manifests import kserve_export
from serving.services.promotions import (
    FOUR_EYES_PROMOTION,
    promotion_create,
    promotion_review,
    rollback_to,
)
from serving.services.rollout_requests import (
    can_act_on_rollout,
    canary_decidable,
    rollout_canary_decide,
    rollout_cancel,
    rollout_cancellable,
)
from serving.token_usage import metering_status
from serving.web import queries
from serving.web.forms import PromoteForm, PromotionReviewForm

ADAPTER_ROWS_PER_PAGE = 50


def _reviewable(actor: Actor, promotions) -> list[dict]:
    """Pending promotions with what this viewer may do about each. The POST
    goes through promotion_review, which checks everything again."""
    rows = []
    for promotion in promotions:
        department_id = promotion.version.adapter.department_id
        may_review = can_approve(actor, department_id)
        own = not can_review(actor, promotion.authors)
        rows.append(
            {
                "promotion": promotion,
                "may_review": may_review,
                "four_eyes": FOUR_EYES_PROMOTION if may_review and own else "",
            }
        )
    return rows


def _approver_pending(actor: Actor, **filters):
    rows = queries.pending_promotions(actor, **filters)
    departments = approver_department_ids(actor)
    if departments is not None:
        rows = rows.filter(version__adapter__department_id__in=departments)
    return rows


# --- Deployments ------------------------------------------------------------


@require_GET
@page
def deployment_list(request, actor: Actor):
    context = {
        "deployments": queries.deployments_health(actor),
        "rollouts": queries.recent_rollouts(actor, limit=10),
        "pending_promotions": _reviewable(actor, _approver_pending(actor)[:20]),
    }
    return render(request, "serving/deployments.html", context)


@require_GET
@page
def deployment_detail(request, actor: Actor, name: str):
    deployment = selectors.deployment_get(actor, name)
    matrix = queries.deployment_matrix(actor, deployment)
    rows = Paginator(matrix["rows"], ADAPTER_ROWS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "deployment": deployment,
        "capacity": queries.capacity_by_deployment([deployment])[deployment.pk],
        "matrix": matrix,
        "rows": rows,
        "rollouts": queries.recent_rollouts(actor, deployment, limit=10),
        "drift_events": selectors.drift_events_for(actor, deployment)[:10],
        "pending_promotions": _reviewable(
            actor, _approver_pending(actor, deployment=deployment)[:20]
        ),
        "allowed_departments": list(deployment.allowed_departments.all()),
        "kserve_refusal": selectors.kserve_refusal(actor, deployment),
        "kserve_missing": kserve.missing_settings(deployment),
        "sees_infrastructure": selectors.sees_infrastructure(actor),
        "fact_disputes": fact_disputes(deployment, deployment.replicas.filter(active=True)),
        "restore_differences": deployment.restore_differences
        if quarantine_reason(deployment)
        else [],
        "restore_quarantined": bool(quarantine_reason(deployment)),
        "access": queries.client_access(actor, deployment, None, example=True),
        # Metered only once its replicas' spans arrive (issue 43).
        "metering": metering_status([deployment.pk])[deployment.pk],
    }
    return render(request, "serving/deployment_detail.html", context)


@require_GET
@page
def deployment_kserve(request, actor: Actor, name: str):
    deployment = selectors.deployment_get(actor, name)
    try:
        text = kserve_export(actor=actor, deployment=deployment)
    except ApplicationError as error:
        return HttpResponse(error.message, status=error.status, content_type="text/plain")
    return kserve.yaml_download(text, deployment)


# --- Promoting a version ----------------------------------------------------


def version_panel(actor: Actor, version: AdapterVersion) -> dict:
    """The version page's serving section: where it is served, the "Promote
    to…" form for viewers who may promote, and its pending promotion requests.
    Shown on the version page through serving_panels.version_serving."""
    served_on = queries.served_where([version.pk]).get(version.pk, [])
    may_promote = version.status == VersionStatus.APPROVED and can_promote(
        actor, version.adapter.department_id
    )
    options = []
    if may_promote:
        # Replicas are not needed here: only the allowed departments.
        listed = selectors.deployments_for(actor).prefetch_related(None)
        for deployment in listed.prefetch_related("allowed_departments"):
            reason = deploy_refusal(actor, deployment, version.adapter)
            if deployment.name in served_on:
                reason = reason or "Serves this version already."
            options.append({"deployment": deployment, "disabled_reason": reason})
    pending = queries.pending_promotions(actor, version=version)
    return {
        "served_on": served_on,
        "may_promote": may_promote,
        "deployment_options": options,
        "pending": _reviewable(actor, pending),
    }


def _promote_target(request, actor: Actor, version: AdapterVersion, data):
    deployments = list(selectors.deployments_for(actor))
    form = PromoteForm(data, deployments=deployments)
    if not form.is_valid():
        return form, None
    deployment = next(d for d in deployments if d.name == form.cleaned_data["deployment"])
    return form, deployment


CHECK_LABELS = {
    "base_model": "Base model",
    "rank": "Rank",
    "target_modules": "Target modules",
    "shapes": "Tensor shapes",
    "capacity": "Registered adapters",
    "host_cache": "Host cache (cold loads)",
    "memory": "LoRA pool memory",
}


def _gate_context(actor, version, deployment, form, error: str = "") -> dict:
    report = evaluate_gate(deployment, version)
    return {
        "version": version,
        "adapter": version.adapter,
        "deployment": deployment,
        "report": report,
        "checks": [
            {**check, "label": CHECK_LABELS.get(check["name"], check["name"])}
            for check in report.as_list()
        ],
        "form": form,
        "canary": form.cleaned_data.get("canary") or deployment.canary_by_default,
        "promote_error": error,
        "not_allowed": deploy_refusal(actor, deployment, version.adapter),
    }


@require_http_methods(["GET", "POST"])
@page
def promote(request, actor: Actor, pk: int):
    """GET: the compatibility gate's result for the chosen deployment (a
    partial for htmx, a page otherwise). POST: promote, then go to the rollout
    page, or say the request now waits for a second person."""
    version = registry_selectors.version_get(actor, pk)
    data = request.POST if request.method == "POST" else request.GET
    form, deployment = _promote_target(request, actor, version, data)
    if deployment is None:
        if request.htmx:
            return render(request, "serving/partials/gate.html", {"form": form}, status=422)
        messages.error(request, " ".join(form.errors.get("deployment", ["Choose a deployment."])))
        return redirect("web:version", pk=version.pk)

    if request.method == "GET":
        context = _gate_context(actor, version, deployment, form)
        if request.htmx:
            return render(request, "serving/partials/gate.html", context)
        return render(request, "serving/promote.html", context)

    try:
        promotion = promotion_create(
            actor=actor,
            deployment=deployment,
            version=version,
            canary=True if form.cleaned_data["canary"] else None,
            canary_share=form.cleaned_data.get("canary_share"),
            canary_bake_seconds=form.cleaned_data.get("canary_bake_seconds"),
        )
    except NotFound:
        raise
    except ApplicationError as error:
        context = _gate_context(actor, version, deployment, form, error.message)
        return render(request, "serving/promote.html", context, status=error.status)
    label = f"{version.adapter.name} v{version.number}"
    if promotion.status == PromotionStatus.PENDING_APPROVAL:
        messages.info(
            request,
            f"Promotion of {label} to {deployment.name} requested. {deployment.name} needs "
            "approval: it waits for a second person, an approver of "
            f"{version.adapter.department.name} or a platform admin.",
        )
        return redirect("web:version", pk=version.pk)
    rollout = promotion.rollouts.order_by("-pk").first()
    assert rollout is not None, "an approved promotion starts its rollout"
    messages.success(request, f"Promoting {label} to {deployment.name}.")
    return redirect("serving:rollout", pk=rollout.pk)


@require_POST
@page
def promotion_review_view(request, actor: Actor, pk: int):
    promotion = selectors.promotion_get(actor, pk)
    form = PromotionReviewForm(request.POST)
    if not form.is_valid():
        raise Http404("Unknown decision.")
    approve = form.cleaned_data["decision"] == "approve"
    version = promotion.version
    try:
        promotion = promotion_review(
            actor=actor, promotion=promotion, approve=approve, comment=form.cleaned_data["comment"]
        )
    except NotFound:
        raise
    except ApplicationError as error:
        context = version_page_context(request, actor, version)
        context.update(review_error=error.message, failed_promotion=promotion.pk)
        return render(request, "registry/version_detail.html", context, status=error.status)
    label = f"{version.adapter.name} v{version.number} to {promotion.deployment.name}"
    if approve:
        rollout = promotion.rollouts.order_by("-pk").first()
        messages.success(request, f"Approved the promotion of {label}.")
        if rollout is not None:
            return redirect("serving:rollout", pk=rollout.pk)
    else:
        messages.success(request, f"Rejected the promotion of {label}.")
    return redirect(safe_next(request, reverse("web:version", args=[version.pk])))


# --- Rollouts ---------------------------------------------------------------


def _rollback_option(actor: Actor, rollout: Rollout) -> dict | None:
    """A rollback makes sense when this rollout put a version in place that
    replaced another and is still what the deployment serves."""
    if (
        rollout.status != RolloutStatus.SUCCEEDED
        or rollout.previous_version is None
        or rollout.target_version_id is None
    ):
        return None
    current = (
        ServedAdapter.objects.filter(deployment=rollout.deployment, adapter=rollout.adapter)
        .values_list("version_id", flat=True)
        .first()
    )
    if current != rollout.target_version_id:
        return None
    reason = deploy_refusal(actor, rollout.deployment, rollout.adapter, Ability.ROLLBACK)
    return {"version": rollout.previous_version, "disabled_reason": reason}


def _cancel_option(actor: Actor, rollout: Rollout) -> dict | None:
    """Unfinished rollouts can be cancelled by approvers and platform admins;
    members see the button off, with the reason."""
    if not rollout_cancellable(rollout):
        return None
    may = can_act_on_rollout(actor, rollout)
    reason = "" if may else "Only an approver of this department or a platform admin may cancel."
    return {"disabled_reason": reason}


def _canary_context(actor: Actor, rollout: Rollout) -> dict | None:
    """A traffic canary's split, gates and countdown, and whether this person
    may promote it now or abort it (approvers, while it bakes undecided)."""
    split = selectors.canary_split(rollout)
    if split is None:
        return None
    # Only while it bakes undecided (CANARY_TRANSITIONS: baking -> *_asked).
    decidable = canary_decidable(rollout)
    may = can_act_on_rollout(actor, rollout)
    reason = "" if may else "Only an approver of this department or a platform admin may decide."
    weights = split["weights"]
    total = sum(weights.values()) or 1
    return {
        **split,
        "canary_weight_share": round(100 * weights.get(str(rollout.canary.replica_id), 0) / total),
        "outcome_display": CanaryOutcome(split["outcome"]).label,
        "decide": {"disabled_reason": reason} if decidable else None,
    }


def _rollout_context(actor: Actor, rollout: Rollout) -> dict:
    progress = queries.rollout_progress(rollout)
    return {
        "rollout": rollout,
        "progress": progress,
        "canary": _canary_context(actor, rollout),
        "rollback": _rollback_option(actor, rollout) if progress["terminal"] else None,
        "cancel": _cancel_option(actor, rollout),
    }


@require_GET
@page
def rollout_detail(request, actor: Actor, pk: int):
    rollout = selectors.rollout_for_display(actor, pk)
    return render(request, "serving/rollout.html", _rollout_context(actor, rollout))


@require_GET
@page
def rollout_live(request, actor: Actor, pk: int):
    """The part of the rollout page that polls itself every second until the
    rollout is over; the last answer has no trigger, so polling stops."""
    rollout = selectors.rollout_for_display(actor, pk)
    response = render(
        request, "serving/partials/rollout_live.html", _rollout_context(actor, rollout)
    )
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@page
def rollout_cancel_view(request, actor: Actor, pk: int):
    rollout = selectors.rollout_get(actor, pk)
    try:
        rollout_cancel(actor=actor, rollout=rollout, comment=request.POST.get("comment", "")[:2000])
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, f"Could not cancel: {error.message}")
        return redirect("serving:rollout", pk=rollout.pk)
    messages.success(
        request,
        f"Cancelled rollout #{rollout.pk}. {rollout.adapter.name} on {rollout.deployment.name} "
        "is free for a new promotion; the reconcile puts back what was served before.",
    )
    return redirect("serving:rollout", pk=rollout.pk)


@require_POST
@page
def rollout_canary_view(request, actor: Actor, pk: int, decision: str):
    rollout = selectors.rollout_get(actor, pk)
    wanted = {"promote": CanaryRequest.PROMOTE, "abort": CanaryRequest.ABORT}.get(decision)
    if wanted is None:
        raise Http404("No such decision.")
    try:
        rollout_canary_decide(
            actor=actor,
            rollout=rollout,
            request=wanted,
            comment=request.POST.get("comment", "")[:2000],
        )
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, f"Could not {decision} the canary: {error.message}")
        return redirect("serving:rollout", pk=rollout.pk)
    if wanted == CanaryRequest.PROMOTE:
        text = "The canary takes all the traffic: the other replicas are swapped now."
    else:
        text = "The canary is aborted: traffic leaves it and its replica goes back."
    messages.success(request, text)
    return redirect("serving:rollout", pk=rollout.pk)


@require_POST
@page
def rollout_rollback(request, actor: Actor, pk: int):
    rollout = selectors.rollout_get(actor, pk)
    if rollout.previous_version is None:
        messages.error(request, "Nothing was served before this rollout: there is no going back.")
        return redirect("serving:rollout", pk=rollout.pk)
    try:
        new = rollback_to(
            actor=actor,
            deployment=rollout.deployment,
            adapter=rollout.adapter,
            version=rollout.previous_version,
        )
    except NotFound:
        raise
    except ApplicationError as error:
        messages.error(request, f"Could not roll back: {error.message}")
        return redirect("serving:rollout", pk=rollout.pk)
    messages.success(
        request,
        f"Rolling {rollout.adapter.name} on {rollout.deployment.name} back to "
        f"v{rollout.previous_version.number}.",
    )
    return redirect("serving:rollout", pk=new.pk)
