"""Reads: a deployment's planner input and when its adapters were last used
(the LoRA pool against its budget is serving.capacity's). Visibility of deployments and adapters is
decided by the callers (serving.selectors, registry.selectors)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.utils import timezone

from core.access import require_visible, visible_department_ids
from core.actors import Actor
from core.errors import NotFound
from core.models import Department
from observability.models import (
    AdapterActivity,
    DailyTokens,
    DailyUsage,
    MeteredRequest,
    MeteringState,
    ReplicaLoraState,
    UnattributedTokens,
)
from serving.capacity import (
    SHAPE_FIELDS,
    PoolFigures,
    Residency,
    deployment_shape,
    pool_figures,
)
from serving.models import Deployment, ServedAdapter
from serving.rules.planner import (
    HOURS_PER_MONTH,
    LLAMA_MODULES,
    PlanInput,
    PlannerInputError,
)
from serving.token_usage import MeteringStatus, Per, TokensUsed


def deployment_pool_figures() -> dict[int, PoolFigures]:
    """Every deployment's pool and budget, in one query."""
    return {d.pk: pool_figures(d) for d in Deployment.objects.all()}


@dataclass(frozen=True)
class ObservedConcurrency:
    peak_running: int | None
    waiting_seen: bool
    samples: int


def observed_concurrency(deployment: Deployment) -> ObservedConcurrency:
    rows = list(
        ReplicaLoraState.objects.filter(replica__deployment=deployment).values_list(
            "peak_running", "waiting_samples", "samples"
        )
    )
    samples = sum(r[2] for r in rows)
    if not samples:
        return ObservedConcurrency(None, False, 0)
    return ObservedConcurrency(
        peak_running=max(r[0] for r in rows),
        waiting_seen=any(r[1] for r in rows),
        samples=samples,
    )


def deployment_plan_input(deployment: Deployment, **overrides) -> PlanInput:
    """The planner's input filled from a deployment's configuration and what
    its replicas reported; `overrides` win (what the planner page's form says)."""
    shape = deployment_shape(deployment)
    if shape is None:
        missing = [name for name in SHAPE_FIELDS if not getattr(deployment, name)]
        raise PlannerInputError({name: "not set on the deployment" for name in missing})
    observed = observed_concurrency(deployment)
    # PlanInput's fields by name, so that `overrides` can replace any of them.
    values: dict[str, Any] = {
        "model": shape,
        "gpu_memory_bytes": deployment.gpu_memory_bytes or 0,
        "gpu_memory_utilization": settings.PLANNER_GPU_MEMORY_UTILIZATION,
        "max_loras": deployment.max_loras,
        "max_cpu_loras": deployment.max_cpu_loras,
        "max_lora_rank": deployment.max_lora_rank,
        "target_modules": tuple(m for m in LLAMA_MODULES if m in shape.linear_modules()),
        "context_length": settings.PLANNER_CONTEXT_LENGTH,
        "use_cases": max(1, deployment.served_adapters.filter(version__isnull=False).count()),
        "lora_memory_share": deployment.lora_memory_share,
        "observed_peak_adapters": observed.peak_running,
        "observed_waiting": observed.waiting_seen,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return PlanInput(**values)


# The adapter page's usage panel counts requests over this many days (today included).
USAGE_PANEL_DAYS = 30


@dataclass(frozen=True)
class Usage:
    """How an adapter is used on one deployment, for the pages."""

    deployment: str
    last_active_at: datetime | None
    active_samples: int
    served_since: datetime | None
    active_now: bool
    idle: bool
    # Counted at the front door in the last USAGE_PANEL_DAYS days; None: nothing counted
    # (no front door, or no request).
    requests: int | None = None
    errors: int | None = None
    # As vLLM counted them (prompt + completion), every caller, the same days;
    # None: none counted (replicas that report no tokens, or no request).
    tokens: int | None = None

    @property
    def idle_since(self) -> datetime | None:
        return self.last_active_at or self.served_since


def _active_window() -> timedelta:
    # vLLM re-stamps its series every engine step while requests run; an idle
    # engine keeps its last label set, stamped when it went idle.
    return timedelta(seconds=2 * settings.SERVING_RECONCILE_INTERVAL_SECONDS)


def adapter_usage(adapter) -> list[Usage]:
    """Every deployment that serves the adapter or has seen it active, in one
    query (plus one for "active now" when it was ever seen)."""
    now = timezone.now()
    threshold = now - timedelta(days=settings.OBSERVABILITY_IDLE_DAYS)
    activity = AdapterActivity.objects.filter(deployment=OuterRef("pk"), adapter=adapter)
    served = ServedAdapter.objects.filter(
        deployment=OuterRef("pk"), adapter=adapter, version__isnull=False
    )
    counted = (
        DailyUsage.objects.filter(
            deployment=OuterRef("pk"),
            adapter=adapter,
            day__gte=now.date() - timedelta(days=USAGE_PANEL_DAYS - 1),
        )
        .values("adapter")
        .annotate(
            n=Sum("requests"),
            e=Sum(F("errors_4xx") + F("errors_5xx")),
        )
    )
    metered = (
        DailyTokens.objects.filter(
            deployment=OuterRef("pk"),
            adapter=adapter,
            day__gte=now.date() - timedelta(days=USAGE_PANEL_DAYS - 1),
        )
        .values("adapter")
        .annotate(t=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    rows = list(
        Deployment.objects.annotate(
            since=Subquery(served.values("updated_at")[:1]),
            last=Subquery(activity.values("last_active_at")[:1]),
            samples=Subquery(activity.values("active_samples")[:1]),
            requests=Subquery(counted.values("n")[:1]),
            errors=Subquery(counted.values("e")[:1]),
            tokens=Subquery(metered.values("t")[:1]),
        )
        .filter(Q(since__isnull=False) | Q(last__isnull=False))
        .order_by("name")
        .values("name", "since", "last", "samples", "requests", "errors", "tokens")
    )
    seen = {row["name"] for row in rows if row["last"]}
    running_now = _running_now(seen, adapter.served_name) if seen else set()
    return [
        Usage(
            deployment=row["name"],
            last_active_at=row["last"],
            active_samples=row["samples"] or 0,
            served_since=row["since"],
            active_now=row["name"] in running_now,
            idle=row["since"] is not None and (row["last"] or row["since"]) < threshold,
            requests=row["requests"],
            errors=row["errors"],
            tokens=row["tokens"],
        )
        for row in rows
    ]


def _running_now(deployments: set[str], served_name: str) -> set[str]:
    recent = timezone.now() - _active_window()
    result = set()
    for deployment, running, waiting in ReplicaLoraState.objects.filter(
        replica__deployment__name__in=deployments, series_timestamp__gte=recent.timestamp(), ok=True
    ).values_list("replica__deployment__name", "running", "waiting"):
        if served_name in (running or []) or served_name in (waiting or []):
            result.add(deployment)
    return result


def deployment_usage(deployment: Deployment, names: list[str]) -> dict[str, Usage]:
    """{served name: Usage} of the named adapters the deployment serves, in two queries."""
    now = timezone.now()
    threshold = now - timedelta(days=settings.OBSERVABILITY_IDLE_DAYS)
    activity = AdapterActivity.objects.filter(
        deployment=deployment, served_name=OuterRef("adapter__served_name")
    )
    rows = ServedAdapter.objects.filter(
        deployment=deployment, adapter__served_name__in=names, version__isnull=False
    ).annotate(
        last=Subquery(activity.values("last_active_at")[:1]),
        samples=Subquery(activity.values("active_samples")[:1]),
    )
    recent = now - _active_window()
    running: set[str] = set()
    for names_running, names_waiting in ReplicaLoraState.objects.filter(
        replica__deployment=deployment, series_timestamp__gte=recent.timestamp(), ok=True
    ).values_list("running", "waiting"):
        running.update(names_running or [])
        running.update(names_waiting or [])
    result = {}
    for row in rows.values("adapter__served_name", "updated_at", "last", "samples"):
        name = row["adapter__served_name"]
        result[name] = Usage(
            deployment=deployment.name,
            last_active_at=row["last"],
            active_samples=row["samples"] or 0,
            served_since=row["updated_at"],
            active_now=name in running,
            idle=(row["last"] or row["updated_at"]) < threshold,
        )
    return result


def lora_residency(deployments) -> dict[int, Residency]:
    """The residency provider of serving.capacity (registered in ready()): the
    busiest replica's last good reading of vLLM's LoRA metrics, per deployment,
    in one query."""
    rows = ReplicaLoraState.objects.filter(
        replica__deployment__in=[d.pk for d in deployments], replica__active=True, ok=True
    ).values_list(
        "replica__deployment_id", "running", "waiting", "gpu_loaded", "cpu_loaded", "observed_at"
    )
    found: dict[int, Residency] = {}
    for deployment_id, running, waiting, gpu, cpu, observed_at in rows:
        seen = found.get(deployment_id, Residency())
        batch = len(gpu) if gpu is not None else len(running or [])
        found[deployment_id] = Residency(
            batch=max(seen.batch or 0, batch),
            host=seen.host if cpu is None else max(seen.host or 0, len(cpu)),
            waiting=max(seen.waiting or 0, len(waiting or [])),
            observed_at=max(filter(None, (seen.observed_at, observed_at)), default=None),
        )
    return found


# -- usage and cost per department (front door counters, observability.usage) ----------

# Quarters, not percent: a member knows their own requests, so an exact share of
# a deployment's cost would give away every other department's total.
SHARE_BANDS = (0.25, 0.5, 0.75, 1.0)


def share_band(share: float | None) -> str:
    """The quarter `share` (0..1) falls in, as people read it: "25–50%"."""
    if share is None:
        return ""
    low = 0.0
    for high in SHARE_BANDS:
        if share <= high or high == SHARE_BANDS[-1]:
            return f"{low * 100:.0f}–{high * 100:.0f}%"
        low = high
    return ""


@dataclass(frozen=True)
class DepartmentCost:
    """A department's monthly share of the GPUs it uses, against one GPU per use case.

    `shared_monthly` is None for people who are not platform admins: with their
    own counts and the deployments' GPUs (both visible to them) it would give
    other departments' totals. They see `share` as a quarter band."""

    department: Department
    requests: int  # to its adapters, counted at the front doors
    use_cases: int  # adapters of the department with requests in the period
    shared_monthly: float | None
    dedicated_monthly: float
    share: float | None  # of the monthly GPU cost of the deployments it used
    # What the department's keys called (vLLM's counts): what it is charged for.
    called_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def saving_monthly(self) -> float | None:
        if self.shared_monthly is None:
            return None
        return round(self.dedicated_monthly - self.shared_monthly, 2)

    @property
    def share_band(self) -> str:
        return share_band(self.share)


def usage_departments(actor: Actor, slug: str | None) -> list[Department]:
    """The departments whose usage `actor` asked for: the one named (NotFound
    for outsiders, as for one that does not exist), or every one they see."""
    if slug:
        department = Department.objects.filter(slug=slug).first()
        if department is None:
            raise NotFound("Department not found.")
        require_visible(actor, department.pk, "Department")
        return [department]
    visible = visible_department_ids(actor)
    departments = Department.objects.all()
    if visible is not None:
        departments = departments.filter(pk__in=visible)
    return list(departments)


def usage_rows(departments: list[Department], start: date, end: date) -> QuerySet[DailyUsage]:
    """Daily rows of the departments from `start` to `end` (both included)."""
    return (
        DailyUsage.objects.filter(department__in=departments, day__gte=start, day__lte=end)
        .select_related("deployment", "department", "version")
        .order_by("day", "department__slug", "served_name", "version_number", "deployment__name")
    )


def token_rows(
    departments: list[Department], start: date, end: date, *, everything: bool = False
) -> QuerySet[DailyTokens]:
    """Daily token rows from `start` to `end` (both included) that the
    departments called or own (chargeback: the caller pays, the owner sees who
    used its adapters). `everything` (a platform admin asking for no one
    department): every row, those without a known caller included."""
    rows = DailyTokens.objects.filter(day__gte=start, day__lte=end)
    if not everything:
        rows = rows.filter(Q(department__in=departments) | Q(owner__in=departments))
    return rows.select_related("deployment", "department", "owner").order_by(
        "day", "department__slug", "served_name", "version_number", "deployment__name", "key_ref"
    )


def unattributed_rows(start: date, end: date) -> QuerySet[UnattributedTokens]:
    """Tokens each deployment's replicas counted that no span reported, per day
    (observability.unmetered): a platform admin's, as no department's."""
    return (
        UnattributedTokens.objects.filter(day__gte=start, day__lte=end)
        .select_related("deployment")
        .order_by("day", "deployment__name")
    )


def token_weight(prompt: int, completion: int) -> float:
    """Tokens as the cost split counts them (SERVING_COST_*_TOKEN_WEIGHT)."""
    return (
        prompt * settings.SERVING_COST_PROMPT_TOKEN_WEIGHT
        + completion * settings.SERVING_COST_COMPLETION_TOKEN_WEIGHT
    )


def department_costs(
    departments: list[Department], start: date, end: date, *, figures: bool
) -> list[DepartmentCost]:
    """Each department's share of its deployments' monthly GPU cost (active replicas x
    GPUs per replica x PLANNER_PRICE_PER_GPU_HOUR x 730 h), beside one dedicated
    one-GPU deployment per use case. A deployment whose replicas report tokens
    (observability.metering) is split by the weighted tokens each department's
    keys called there in the period, out of all its tokens (callers without a
    key included, so that nobody pays for them); one without is split by the
    requests to each department's adapters counted at its front door. Without
    `figures` (anyone but a platform admin) the shared cost is left out and only
    its band is told."""
    price = settings.PLANNER_PRICE_PER_GPU_HOUR
    period = DailyUsage.objects.filter(day__gte=start, day__lte=end)
    tokens = DailyTokens.objects.filter(day__gte=start, day__lte=end)
    mine = list(
        period.filter(department__in=departments)
        .values("department_id", "deployment_id")
        .annotate(n=Sum("requests"))
    )
    called = list(
        tokens.filter(department__in=departments)
        .values("department_id", "deployment_id")
        .annotate(n=Sum("requests"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    )
    deployment_ids = {row["deployment_id"] for row in mine + called}
    request_totals = dict(
        period.filter(deployment_id__in=deployment_ids)
        .values("deployment_id")
        .annotate(n=Sum("requests"))
        .values_list("deployment_id", "n")
    )
    token_totals = {
        row["deployment_id"]: token_weight(row["p"], row["c"])
        for row in tokens.filter(deployment_id__in=deployment_ids)
        .values("deployment_id")
        .annotate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    }
    # Tokens vLLM counted that no span reported (aborted streams): in each
    # deployment's total, so that no department's share grows by them.
    for row in (
        UnattributedTokens.objects.filter(
            day__gte=start, day__lte=end, deployment_id__in=deployment_ids
        )
        .values("deployment_id")
        .annotate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    ):
        if row["deployment_id"] in token_totals:
            token_totals[row["deployment_id"]] += token_weight(row["p"], row["c"])
    metered = {d for d, total in token_totals.items() if total > 0}
    gpus = {
        d.pk: d.live_replicas * d.gpus
        for d in Deployment.objects.filter(pk__in=deployment_ids).annotate(
            live_replicas=Count("replicas", filter=Q(replicas__active=True))
        )
    }
    owned: dict[int, set[int]] = {}  # department -> the adapters it owns that were called
    for model, column in ((DailyUsage, "department_id"), (DailyTokens, "owner_id")):
        for department_id, adapter_id in (
            model.objects.filter(
                day__gte=start,
                day__lte=end,
                requests__gt=0,
                adapter__isnull=False,
                **{f"{column}__in": [d.pk for d in departments]},
            )
            .values_list(column, "adapter_id")
            .distinct()
        ):
            owned.setdefault(department_id, set()).add(adapter_id)
    costs = []
    for department in departments:
        shares: dict[int, float] = {}  # deployment -> the department's part of it
        for row in called:
            if row["department_id"] == department.pk and row["deployment_id"] in metered:
                total = token_totals[row["deployment_id"]]
                shares[row["deployment_id"]] = token_weight(row["p"], row["c"]) / total
        for counted in mine:
            deployment_id = counted["deployment_id"]
            if counted["department_id"] != department.pk or deployment_id in metered:
                continue
            if request_totals.get(deployment_id):
                shares[deployment_id] = counted["n"] / request_totals[deployment_id]
        used = {d: part for d, part in shares.items() if part > 0}
        shared = sum(gpus[d] * price * HOURS_PER_MONTH * part for d, part in used.items())
        whole = sum(gpus[d] * price * HOURS_PER_MONTH for d in used)
        own_calls = [r for r in called if r["department_id"] == department.pk]
        use_cases = len(owned.get(department.pk, ()))
        costs.append(
            DepartmentCost(
                department=department,
                requests=sum(r["n"] for r in mine if r["department_id"] == department.pk),
                use_cases=use_cases,
                shared_monthly=round(shared, 2) if figures else None,
                dedicated_monthly=round(use_cases * price * HOURS_PER_MONTH, 2),
                share=shared / whole if whole else None,
                called_requests=sum(r["n"] for r in own_calls),
                prompt_tokens=sum(r["p"] for r in own_calls),
                completion_tokens=sum(r["c"] for r in own_calls),
            )
        )
    return costs


# -- tokens per caller (observability.metering), for limits at the door ------------


def tokens_used_since(per: Per, since: datetime, ids=None) -> dict[int, TokensUsed]:
    """{key or department id: its requests and tokens since `since`}: to the
    request from the ledger while it holds the period (one indexed range
    query), by whole UTC days before that (the ledger is pruned). Registered
    as serving.token_usage's reader."""
    column = "key_id" if per == "key" else "department_id"
    retained = timezone.now() - timedelta(days=settings.OBSERVABILITY_METERED_REQUEST_DAYS - 1)
    rows: QuerySet[MeteredRequest] | QuerySet[DailyTokens]
    if since >= retained:
        rows = MeteredRequest.objects.filter(finished_at__gte=since)
        sums = {"n": Count("pk"), "p": Sum("prompt_tokens"), "c": Sum("completion_tokens")}
    else:
        rows = DailyTokens.objects.filter(day__gte=since.date())
        sums = {"n": Sum("requests"), "p": Sum("prompt_tokens"), "c": Sum("completion_tokens")}
    rows = rows.filter(**{f"{column}__isnull": False})
    if ids is not None:
        rows = rows.filter(**{f"{column}__in": list(ids)})
    return {
        row[column]: TokensUsed(row["n"], row["p"] or 0, row["c"] or 0)
        for row in rows.values(column).annotate(**sums).order_by()
    }


# A deployment whose replicas counted tokens this long after its last span has
# stopped sending them (an exporter gone, a token rotated, a receiver moved).
SPANS_STALE_SECONDS = 15 * 60


def metering_statuses(deployment_ids=None, *, now=None) -> dict[int, MeteringStatus]:
    """Per deployment id: metered only once its replicas' spans arrive, and no
    longer when its replicas counted tokens (vLLM's /metrics, read by the
    reconcile) more than SPANS_STALE_SECONDS after the last span came."""
    now = now or timezone.now()
    deployments = Deployment.objects.all()
    if deployment_ids is not None:
        deployments = deployments.filter(pk__in=list(deployment_ids))
    states = {
        row["deployment_id"]: row
        for row in MeteringState.objects.filter(deployment_id__in=deployments.values("pk")).values(
            "deployment_id", "last_span_at", "counted_at"
        )
    }
    minutes = SPANS_STALE_SECONDS // 60
    found = {}
    for pk in deployments.values_list("pk", flat=True):
        state = states.get(pk) or {"last_span_at": None, "counted_at": None}
        last, counted = state["last_span_at"], state["counted_at"]
        if last is None:
            found[pk] = MeteringStatus(False, "not metered: no spans received from its replicas")
        elif (
            counted is not None
            and (counted - last).total_seconds() > SPANS_STALE_SECONDS
            and (now - last).total_seconds() > SPANS_STALE_SECONDS
        ):
            found[pk] = MeteringStatus(
                False,
                f"not metered: no spans received in the last {minutes} minutes "
                "while its replicas counted tokens",
            )
        else:
            found[pk] = MeteringStatus(True, "metered: its replicas' spans arrive")
    return found


def metering_health(sender, **kwargs):
    """/readyz: which deployments' tokens are not metered (names only; optional,
    so a deployment without spans never takes the web server out of service)."""
    from django.db import DatabaseError

    try:
        statuses = metering_statuses()
        names = dict(Deployment.objects.values_list("pk", "name"))
    except DatabaseError as error:  # the database check says so already
        return "metering", {"ok": False, "optional": True, "error": str(error)}
    off = sorted(names[pk] for pk, status in statuses.items() if not status.metered)
    if not off:
        return "metering", {"ok": True, "optional": True}
    notice = f"tokens not metered (no spans from their replicas): {', '.join(off)}"
    return "metering", {"ok": False, "optional": True, "notice": notice}
