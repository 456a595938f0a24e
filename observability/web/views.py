"""The planner pages: a blank one (paste a config.json) and one per deployment,
filled from its configuration and from what its replicas reported. Plans are
reads: the form is a GET, so a plan has a URL people can share."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.shortcuts import render
from django.views.decorators.http import require_GET
from rest_framework.exceptions import ValidationError

from core import selectors as core_selectors
from core.actors import Actor
from core.web import page
from observability.api.serializers import GPU_MEMORY, PlannerInputSerializer
from observability.api.views import usage_report
from observability.planning import OVERRIDES, form_defaults, plan_for
from observability.selectors import observed_concurrency
from serving import selectors as serving_selectors
from serving.rules.planner import DTYPE_BYTES, VALID_LORA_RANKS, PlannerInputError

EXAMPLE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def _query(request) -> tuple[dict, dict]:
    """The form's fields as the serializer takes them, and field errors of the parsing."""
    data, errors = {}, {}
    for name in (*OVERRIDES, "dtype"):
        value = request.GET.get(name, "").strip()
        if value:
            data[name] = value
    raw = request.GET.get("config", "").strip()
    if raw:
        try:
            data["config"] = json.loads(raw)
        except ValueError as error:
            errors["config"] = [f"Not JSON: {error}"]
    modules = request.GET.get("target_modules", "").strip()
    if modules:
        data["target_modules"] = [m.strip() for m in modules.split(",") if m.strip()]
    return data, errors


def _plan_context(request, deployment=None) -> dict:
    data, errors = _query(request)
    if deployment is not None:
        data["deployment"] = deployment.name
    defaults = form_defaults(deployment)
    form = {**request.GET.dict()}
    for name, value in defaults.items():
        if not form.get(name, "").strip():
            form[name] = value
    context = {
        "form": form,
        "gpus": GPU_MEMORY,
        "dtypes": sorted(DTYPE_BYTES),
        "ranks": VALID_LORA_RANKS,
        "example_config": json.dumps(EXAMPLE_CONFIG, indent=2),
        "deployment": deployment,
        "errors": errors,
        "plan": None,
    }
    asked = deployment is not None or bool(request.GET)
    if not asked or errors:
        return context
    serializer = PlannerInputSerializer(data=data)
    if not serializer.is_valid():
        context["errors"] = serializer.errors
        return context
    try:
        context["plan"] = plan_for(serializer.validated_data, deployment)
    except PlannerInputError as error:
        context["errors"] = {name: [message] for name, message in error.fields.items()}
    return context


@require_GET
@page
def planner_page(request, actor: Actor):
    return render(request, "observability/planner.html", _plan_context(request))


@require_GET
@page
def deployment_plan_page(request, actor: Actor, name: str):
    deployment = serving_selectors.deployment_get(actor, name)
    context = _plan_context(request, deployment)
    context["observed"] = observed_concurrency(deployment)
    return render(request, "observability/planner.html", context)


@require_GET
@page
def usage_page(request, actor: Actor):
    """Requests and tokens per caller, adapter and day, and each department's monthly cost:
    what GET /api/v1/usage/ answers, with the same query."""
    context = {
        "query": request.GET.dict(),
        "errors": {},
        "report": None,
        "departments": list(core_selectors.departments_for(actor).order_by("name")),
    }
    try:
        context["report"] = report = usage_report(actor, request.GET)
    except ValidationError as error:
        context["errors"] = error.detail
    else:
        costs = report["costs"]
        # Figures only where the costs carry them (platform admins: DepartmentCost).
        figures = all(c.shared_monthly is not None for c in costs)
        context["totals"] = {
            "requests": sum(c.requests for c in costs),
            "prompt_tokens": sum(c.prompt_tokens for c in costs),
            "completion_tokens": sum(c.completion_tokens for c in costs),
            "use_cases": sum(c.use_cases for c in costs),
            "shared": sum(c.shared_monthly for c in costs) if figures else None,
            "dedicated": sum(c.dedicated_monthly for c in costs),
            "saving": sum(c.saving_monthly for c in costs) if figures else None,
        }
    # The form sends its blank fields; the API refuses a blank parameter (as its
    # schema says), so the link carries only the ones given.
    given = {name: value for name, value in context["query"].items() if value}
    context["csv_query"] = urlencode({**given, "format": "csv"})
    return render(request, "observability/usage.html", context)
