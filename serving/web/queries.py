"""Reads that only the serving pages need. Visibility is always the serving
selectors' (serving.selectors), never re-decided here, and each function runs
a fixed number of queries however many adapters a deployment serves."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from core.access import can_promote, visible_department_ids
from core.actors import Actor
from registry.models import AdapterVersion, VersionStatus
from serving import selectors
from serving.capacity import Tiers, pool_figures, tiers_by_deployment
from serving.models import (
    Deployment,
    PromotionStatus,
    ReplicaHealth,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.rules.transitions import ROLLOUT_TERMINAL
from serving.sync_state import SyncState, loaded_adapters


def _percent(part: int, whole: int | None) -> int:
    if not whole:
        return 0
    return min(100, round(100 * part / whole))


@dataclass(frozen=True)
class Capacity:
    """vLLM's three tiers and the LoRA pool of one deployment, over every
    department: the limits are shared, so the numbers are too (never which adapters)."""

    tiers: Tiers
    resident_bytes: int  # the LoRA pool vLLM preallocates, as the gate budgets it
    gpu_memory_bytes: int | None
    lora_memory_share: float

    @property
    def registered(self) -> int:
        return self.tiers.registered.used or 0

    @property
    def memory_budget(self) -> int | None:
        if not self.gpu_memory_bytes:
            return None
        return int(self.gpu_memory_bytes * self.lora_memory_share)

    @property
    def memory_percent(self) -> int:
        return _percent(self.resident_bytes, self.memory_budget)

    @property
    def memory_over(self) -> bool:
        budget = self.memory_budget
        return budget is not None and self.resident_bytes > budget

    @property
    def share_percent(self) -> int:
        return round(self.lora_memory_share * 100)


def capacity_by_deployment(deployments: list[Deployment]) -> dict[int, Capacity]:
    """A fixed number of queries for every deployment's tiers (serving.capacity);
    memory is the planner's pool model."""
    tiers = tiers_by_deployment(deployments)
    return {
        d.pk: Capacity(
            tiers=tiers[d.pk],
            resident_bytes=pool_figures(d).pool_bytes or 0,
            gpu_memory_bytes=d.gpu_memory_bytes,
            lora_memory_share=d.lora_memory_share,
        )
        for d in deployments
    }


@dataclass(frozen=True)
class DeploymentHealth:
    deployment: Deployment
    replicas_up: int
    replicas_total: int
    capacity: Capacity

    @property
    def healthy(self) -> bool:
        return self.replicas_total > 0 and self.replicas_up == self.replicas_total


def deployments_health(actor: Actor) -> list[DeploymentHealth]:
    """Every deployment with replicas up/total and its capacity, in four queries."""
    deployments = list(selectors.deployments_for(actor))
    capacity = capacity_by_deployment(deployments)
    rows = []
    for d in deployments:
        active = [r for r in d.replicas.all() if r.active]
        up = sum(1 for r in active if r.health == ReplicaHealth.UP)
        rows.append(DeploymentHealth(d, up, len(active), capacity[d.pk]))
    return rows


def served_where(version_ids: list[int]) -> dict[int, list[str]]:
    """{version id: names of the deployments meant to serve it}, in one query."""
    where: dict[int, list[str]] = defaultdict(list)
    rows = (
        ServedAdapter.objects.filter(version_id__in=version_ids)
        .order_by("deployment__environment", "deployment__name")
        .values_list("version_id", "deployment__name")
    )
    for version_id, name in rows:
        where[version_id].append(name)
    return dict(where)


def recent_rollouts(actor: Actor, deployment: Deployment | None = None, limit: int = 10):
    """Newest rollouts the actor may see, without their steps and attempts."""
    rows = selectors.rollouts_for(actor).prefetch_related(None)
    if deployment is not None:
        rows = rows.filter(deployment=deployment)
    return rows[:limit]


def pending_promotions(actor: Actor, **filters):
    return (
        selectors.promotions_for(actor)
        .filter(status=PromotionStatus.PENDING_APPROVAL, **filters)
        .order_by("created_at")
    )


# --- desired against actual ----------------------------------------------------

# How one adapter stands on one replica, from the replica's last reconcile
# (serving.sync_state decides), and two states only the page knows.
IN_SYNC = SyncState.IN_SYNC.value
MISSING = SyncState.MISSING.value
WRONG_ROOT = SyncState.WRONG_ROOT.value
NOT_UNLOADED = SyncState.NOT_UNLOADED.value
DOWN = SyncState.DOWN.value
KEPT = SyncState.KEPT.value
CHANGED = "changed"  # desired state moved after the replica was last checked
UNCHECKED = "unchecked"  # never reconciled

CELL_LABELS = {
    IN_SYNC: "loaded",
    MISSING: "missing",
    WRONG_ROOT: "wrong root",
    NOT_UNLOADED: "still loaded",
    CHANGED: "awaiting check",
    UNCHECKED: "not checked yet",
    DOWN: "replica down",
    KEPT: "kept for rollback",
}
DRIFT = {state.value for state in SyncState if state.drifted}


@dataclass(frozen=True)
class Cell:
    state: str
    actual_root: str | None
    placed: bool = True  # placement puts the adapter on this replica (serving.rules.placement_plan)

    @property
    def label(self) -> str:
        if not self.placed and self.state == IN_SYNC:
            return "not placed"
        return CELL_LABELS[self.state]

    @property
    def drift(self) -> bool:
        return self.state in DRIFT


def _cell(replica: dict, row: dict, changed_at) -> Cell:
    # The state deployment_state classified on the full roots: members see only
    # the folder names of the roots.
    state, actual, placed = row["state"], row["actual_root"], row.get("placed", True)
    if state == DOWN:
        return Cell(DOWN, actual, placed)
    checked = replica["last_checked_at"]
    if checked is None:
        return Cell(UNCHECKED, actual, placed)
    if state != IN_SYNC and changed_at is not None and changed_at > checked:
        return Cell(CHANGED, actual, placed)
    return Cell(state, actual, placed)


def _served_root(desired: dict | None) -> str | None:
    if desired is None or not desired["version_id"]:
        return None
    return desired["served_path"]


def deployment_matrix(actor: Actor, deployment: Deployment) -> dict:
    """serving.selectors.deployment_state (which keeps to the actor's
    departments) shaped for the page: one row per adapter, one cell per replica,
    drifted rows first."""
    state = selectors.deployment_state(actor, deployment)
    desired = {row["served_name"]: row for row in state["desired"]}
    changed = dict(
        selectors.served_adapters_for(actor, deployment).values_list(
            "adapter__served_name", "updated_at"
        )
    )
    replicas = state["replicas"]
    placement = {p["served_name"]: p for p in selectors.deployment_placement(actor, deployment)}
    rows: dict[str, dict] = {}
    for index, replica in enumerate(replicas):
        for item in replica["adapters"]:
            name = item["served_name"]
            row = rows.setdefault(
                name,
                {
                    "served_name": name,
                    "desired": desired.get(name),
                    # The version's path, also where placement leaves a replica out.
                    "desired_root": _served_root(desired.get(name)),
                    "placement": placement.get(name),
                    "cells": [None] * len(replicas),
                },
            )
            row["cells"][index] = _cell(replica, item, changed.get(name))
    shown = []
    for row in rows.values():
        # A retired adapter that no replica still holds is history, not state.
        if row["desired_root"] is None and all(c.state == IN_SYNC for c in row["cells"]):
            continue
        row["drift"] = any(c.drift for c in row["cells"])
        shown.append(row)
    if not replicas:
        shown = [
            {
                "served_name": n,
                "desired": d,
                "desired_root": d["served_path"],
                "placement": placement.get(n),
                "cells": [],
                "drift": False,
            }
            for n, d in desired.items()
            if d["version_id"]
        ]
    shown.sort(key=lambda r: (not r["drift"], r["served_name"]))
    # deployment_state lists the active replicas in this order.
    records = [r for r in deployment.replicas.all() if r.active]
    for replica, record in zip(replicas, records, strict=True):
        # vLLM's errors name hosts and paths: the platform's, not a department's.
        replica["last_error"] = record.last_error if selectors.sees_infrastructure(actor) else ""
        replica["loaded_count"] = len(loaded_adapters(record))
        replica["in_sync_polls"] = record.in_sync_polls
        replica["in_sync_since"] = record.in_sync_since
    return {
        "replicas": replicas,
        "rows": shown,
        "drift_count": sum(1 for r in shown if r["drift"]),
        "unknown_count": sum(len(r["unknown_adapters"]) for r in replicas),
        "shows_unknown": visible_department_ids(actor) is None,
        "last_reconciled_at": state["last_reconciled_at"],
    }


# --- rollout progress ------------------------------------------------------------

DONE, ACTIVE, FAILED, WAITING, SKIPPED = "done", "active", "failed", "waiting", "skipped"


def _stage_state(rollout: Rollout) -> str:
    if rollout.status == RolloutStatus.PENDING:
        return WAITING
    if rollout.status == RolloutStatus.STAGING:
        return ACTIVE
    if rollout.kind == RolloutKind.RETIRE:
        return SKIPPED
    if rollout.served_path:
        return DONE
    return FAILED if rollout.status in ROLLOUT_TERMINAL else WAITING


def _replica_phases(step, stage: str) -> tuple[str, str]:
    """(load, verify) states of one replica step."""
    status = step.status
    if status in (ReplicaStepStatus.DEFERRED, ReplicaStepStatus.CANCELLED):
        return SKIPPED, SKIPPED
    if stage in (WAITING, ACTIVE) or status == ReplicaStepStatus.PENDING:
        return WAITING, WAITING
    if status == ReplicaStepStatus.LOADING:
        return ACTIVE, WAITING
    if status == ReplicaStepStatus.VERIFYING:
        return DONE, ACTIVE
    if status == ReplicaStepStatus.SUCCEEDED:
        return DONE, DONE
    # Failed or rolled back: how far it got, from its recorded HTTP attempts.
    attempts = step.attempts.all()
    verifies = [a for a in attempts if a.purpose.startswith("verify")]
    if not verifies:
        refused = any(a.purpose == "load" and not a.ok and not a.transient for a in attempts)
        return (FAILED if status == ReplicaStepStatus.FAILED or refused else DONE), WAITING
    return DONE, (FAILED if status == ReplicaStepStatus.FAILED or not verifies[-1].ok else DONE)


def rollout_progress(rollout: Rollout) -> dict:
    """Stage -> load -> verify for each replica, from the rows the worker writes."""
    stage = _stage_state(rollout)
    steps: list[dict[str, Any]] = []
    for step in rollout.replica_steps.all():
        load, verify = _replica_phases(step, stage)
        if rollout.kind == RolloutKind.RETIRE:
            verify = SKIPPED
        error = step.error
        if not error and step.status in (ReplicaStepStatus.FAILED, ReplicaStepStatus.ROLLED_BACK):
            # A rolled-back step keeps no error of its own; vLLM's words are in its attempts.
            # The first permanent refusal is what stopped it (a later unload's
            # "not found" while rolling back is not news).
            failed = [a for a in step.attempts.all() if not a.ok and a.error]
            permanent = [a for a in failed if not a.transient]
            error = (permanent or failed)[0].error if failed else ""
        steps.append({"step": step, "stage": stage, "load": load, "verify": verify, "error": error})
    return {
        "stage": stage,
        "steps": steps,
        "terminal": rollout.status in ROLLOUT_TERMINAL,
        "attempt_count": sum(len(s["step"].attempts.all()) for s in steps),
        "replicas": selectors.rollout_replica_summary(rollout),
    }


# --- live beside approved ----------------------------------------------------------


@dataclass(frozen=True)
class Live:
    deployment: str
    number: int
    version_id: int


@dataclass(frozen=True)
class Standing:
    """What an adapter serves where, beside its newest approved version: approved
    is not live until someone promotes it, and people read the two as one."""

    live: list[Live]
    approved_id: int | None
    approved_number: int | None
    may_promote: bool

    @property
    def unpromoted(self) -> bool:
        """The newest approved version is newer than what some deployment serves,
        or nothing serves the adapter at all."""
        if self.approved_number is None:
            return False
        if not self.live:
            return True
        return any(row.number < self.approved_number for row in self.live)


def adapter_standing(actor: Actor, adapters) -> dict[int, Standing]:
    """{adapter id: Standing} for adapters the actor already sees, in two queries."""
    adapters = list(adapters)
    ids = [a.pk for a in adapters]
    live: dict[int, list[Live]] = defaultdict(list)
    rows = (
        ServedAdapter.objects.filter(adapter_id__in=ids, version__isnull=False)
        .order_by("deployment__name")
        .values_list("adapter_id", "deployment__name", "version__number", "version_id")
    )
    for adapter_id, name, number, version_id in rows:
        live[adapter_id].append(Live(name, number, version_id))
    approved: dict[int, tuple[int, int]] = {}
    newest = (
        AdapterVersion.objects.filter(adapter_id__in=ids, status=VersionStatus.APPROVED)
        .order_by("adapter_id", "-number")
        .values_list("adapter_id", "pk", "number")
    )
    for adapter_id, pk, number in newest:
        approved.setdefault(adapter_id, (pk, number))
    standing = {}
    for adapter in adapters:
        newest_approved = approved.get(adapter.pk)
        standing[adapter.pk] = Standing(
            live=live.get(adapter.pk, []),
            approved_id=newest_approved[0] if newest_approved else None,
            approved_number=newest_approved[1] if newest_approved else None,
            may_promote=can_promote(actor, adapter.department_id),
        )
    return standing


# --- how clients reach a deployment ---------------------------------------------------

EXAMPLE_BODY = (
    '{"model": "%s", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32}'
)


def front_door_url(deployment: Deployment) -> str | None:
    """The URL clients use for the deployment's front door, or None without one."""
    listen = settings.SERVING_DOORS.get(deployment.name)
    if not listen:
        return None
    url = settings.SERVING_DOOR_URLS.get(deployment.name)
    scheme = "https" if settings.SERVING_DOOR_CERTIFICATES.get(deployment.name) else "http"
    return (url or f"{scheme}://{listen}").rstrip("/")


def curl_example(base_url: str, served_name: str) -> str:
    """A request a person can paste: the key is a placeholder they replace."""
    return (
        f"curl {base_url}/v1/chat/completions \\\n"
        "  -H 'Authorization: Bearer <your key>' \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d '{EXAMPLE_BODY % served_name}'"
    )


def client_access(
    actor: Actor, deployment: Deployment, served_name: str | None, *, example: bool = False
) -> dict:
    """The "How clients reach this" card: the front door's URL, a copyable
    request for one adapter, and a traffic canary's split while one bakes.
    Without `served_name`, canaries of every adapter the actor sees there, and
    (`example`) the request names one of those adapters it serves."""
    url = front_door_url(deployment)
    named = served_name
    if named is None and example:
        named = (
            selectors.served_adapters_for(actor, deployment)
            .filter(version__isnull=False)
            .order_by("adapter__served_name")
            .values_list("adapter__served_name", flat=True)
            .first()
        )
    baking = (
        selectors.rollouts_for(actor)
        .prefetch_related(None)
        .filter(deployment=deployment, status=RolloutStatus.BAKING, canary__share__isnull=False)
    )
    if served_name:
        baking = baking.filter(adapter__served_name=served_name)
    canaries = []
    for rollout in baking.select_related("adapter", "target_version", "canary__replica")[:5]:
        split = selectors.canary_split(rollout)
        if split is not None:
            canaries.append({"rollout": rollout, **split})
    return {
        "deployment": deployment,
        "url": url,
        "served_name": named,
        "curl": curl_example(url, named or "<adapter>") if url else "",
        "canaries": canaries,
    }
