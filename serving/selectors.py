"""Reads for the serving control plane, restricted by the actor's departments."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from core.access import visible_department_ids
from core.actors import Actor
from core.errors import NotAuthorized, NotFound
from core.redaction import redact
from serving.models import (
    Deployment,
    DriftEvent,
    HttpAttempt,
    Promotion,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    ServedAdapter,
    VersionFingerprint,
)
from serving.rules.kept_copies import KeptCopy
from serving.rules.placement_plan import placed_keys
from serving.rules.transitions import CANARY_UNDECIDED
from serving.sync_state import SyncState, classify_kept, desired_root, loaded_adapters


def deployments_for(actor: Actor) -> QuerySet[Deployment]:
    """Platform admins see every deployment; others only those their departments
    may use (no allowed departments means every department). Members and tokens
    get them through DeploymentSummarySerializer / `sees_infrastructure`:
    without replica URLs, volume paths or whether a key is set."""
    queryset = Deployment.objects.prefetch_related("replicas", "allowed_departments")
    ids = visible_department_ids(actor)
    if ids is None:
        return queryset
    allowed = Deployment.allowed_departments.through.objects.filter(department_id__in=ids)
    return queryset.filter(
        Q(allowed_departments__isnull=True) | Q(pk__in=allowed.values("deployment_id"))
    ).distinct()


def sees_infrastructure(actor: Actor) -> bool:
    """Replica addresses, volume paths and keys are the platform's, not a department's."""
    return actor.is_platform_admin


def _folder_only(path: str | None) -> str | None:
    # The staged folder's own name (v3-1a2b3c4d) says which version; the volume path is hidden.
    return PurePosixPath(path).name if path else path


def deployment_get(actor: Actor, name: str) -> Deployment:
    deployment = deployments_for(actor).filter(name=name).first()
    if deployment is None:
        raise NotFound(f"Deployment {name!r} not found.")
    return deployment


def _restrict(queryset: QuerySet, actor: Actor, field: str) -> QuerySet:
    ids = visible_department_ids(actor)
    return queryset if ids is None else queryset.filter(**{f"{field}__in": ids})


def served_adapters_for(actor: Actor, deployment: Deployment) -> QuerySet[ServedAdapter]:
    return _restrict(
        ServedAdapter.objects.filter(deployment=deployment).select_related(
            "adapter__department", "version"
        ),
        actor,
        "adapter__department_id",
    )


def promotions_for(actor: Actor) -> QuerySet[Promotion]:
    return _restrict(
        Promotion.objects.select_related(
            "deployment", "version__adapter__department", "requested_by", "reviewed_by", "canary"
        ),
        actor,
        "version__adapter__department_id",
    )


def promotion_get(actor: Actor, promotion_id: int) -> Promotion:
    promotion = promotions_for(actor).filter(pk=promotion_id).first()
    if promotion is None:
        raise NotFound("Promotion not found.")
    return promotion


def rollouts_for(actor: Actor) -> QuerySet[Rollout]:
    steps = ReplicaRollout.objects.select_related("replica").prefetch_related(
        Prefetch("attempts", queryset=HttpAttempt.objects.order_by("started_at", "id"))
    )
    return _restrict(
        Rollout.objects.select_related(
            "deployment",
            "adapter__department",
            "target_version",
            "previous_version",
            "requested_by",
            "canary__replica",
        ).prefetch_related(Prefetch("replica_steps", queryset=steps)),
        actor,
        "adapter__department_id",
    )


def rollout_replica_summary(rollout: Rollout) -> dict:
    """How many replicas serve the rollout's version, and how many were deferred
    because they were down: "3 of 4 replicas serve v2, 1 deferred (down)"."""
    steps = list(rollout.replica_steps.all())
    done = sum(1 for s in steps if s.status == ReplicaStepStatus.SUCCEEDED)
    deferred = sum(1 for s in steps if s.status == ReplicaStepStatus.DEFERRED)
    text = ""
    if steps:
        if rollout.kind == RolloutKind.RETIRE:
            text = f"Unloaded from {done} of {len(steps)} replicas"
        else:
            version = rollout.target_version.number if rollout.target_version else "?"
            text = f"{done} of {len(steps)} replicas serve v{version}"
        if deferred:
            text += f", {deferred} deferred (down)"
    return {"total": len(steps), "done": done, "deferred": deferred, "text": text}


def rollout_get(actor: Actor, rollout_id: int) -> Rollout:
    rollout = rollouts_for(actor).filter(pk=rollout_id).first()
    if rollout is None:
        raise NotFound("Rollout not found.")
    return rollout


def replica_labels(deployment: Deployment) -> dict[int, str]:
    """What members see instead of replica addresses: replica-1, replica-2, ... in
    address order, the same in the state view, rollouts and their attempts."""
    ids = deployment.replicas.order_by("base_url").values_list("pk", flat=True)
    return {pk: f"replica-{n}" for n, pk in enumerate(ids, start=1)}


def _without_address(text: str, base_url: str, label: str) -> str:
    # vLLM's and httpx's error texts name the URL, and sometimes just host:port.
    if not text:
        return text
    netloc = urlsplit(base_url).netloc
    text = text.replace(base_url.rstrip("/"), label)
    return text.replace(netloc, label) if netloc else text


def rollouts_for_display(actor: Actor, rollouts) -> list[Rollout]:
    """Rollouts with their steps and attempts, for a page or an API answer. For
    people without `sees_infrastructure` the replica addresses become labels and
    volume paths folder names, in memory only: never save what this returns."""
    rollouts = list(rollouts)
    if sees_infrastructure(actor):
        return rollouts
    labels_by_deployment: dict[int, dict[int, str]] = {}
    for rollout in rollouts:
        if rollout.deployment_id not in labels_by_deployment:
            labels_by_deployment[rollout.deployment_id] = replica_labels(rollout.deployment)
        _hide_infrastructure(rollout, labels_by_deployment[rollout.deployment_id])
    return rollouts


def _hide_infrastructure(rollout: Rollout, labels: dict[int, str]) -> None:
    rollout.staged_path = _folder_only(rollout.staged_path) or ""
    rollout.served_path = _folder_only(rollout.served_path) or ""
    for step in rollout.replica_steps.all():
        replica = step.replica
        base_url, label = replica.base_url, labels.get(replica.pk, "replica")
        step.error = redact(_without_address(step.error, base_url, label))
        rollout.error = _without_address(rollout.error, base_url, label)
        for attempt in step.attempts.all():
            attempt.url = label + (urlsplit(attempt.url).path or "/")
            attempt.error = redact(_without_address(attempt.error, base_url, label))
        replica.base_url = label
        replica.last_error = ""
    canary = getattr(rollout, "canary", None)
    if canary is not None and canary.replica_id is not None:
        canary.replica.base_url = labels.get(canary.replica_id, "replica")
    # Staging and storage failures ("Staging failed: ...", "Waiting for the
    # artifact store: ...") name the volume, the bucket and the endpoint.
    rollout.error = redact(rollout.error)


def rollout_for_display(actor: Actor, rollout_id: int) -> Rollout:
    return rollouts_for_display(actor, [rollout_get(actor, rollout_id)])[0]


def deployment_state(actor: Actor, deployment: Deployment) -> dict:
    """Desired (the database) against actual (what each replica listed at the
    last reconcile, or what a rollout verified since), per adapter the actor
    may see. `in_sync` is true only where the replica's last listing equals the
    desired state and the replica has not been found down since: a replica that
    is down lists nothing, whatever it said before. A replica that keeps the
    previous version after a swap, drained, for a rollback (serving.rules.kept_copies)
    is in sync with state "kept" until its time is up."""
    served = list(served_adapters_for(actor, deployment))
    placed = {s.pk: placed_keys(s) for s in served}
    kept_copies = {s.pk: KeptCopy.from_dict(s.kept_copy) for s in served}
    now = time.time()
    visible_names = {s.adapter.served_name for s in served}
    # Unknown adapters could be any department's; replica URLs are the platform's.
    show_unknown = sees_infrastructure(actor)
    replicas: list[dict] = []
    labels = replica_labels(deployment)
    for replica in deployment.replicas.all():
        if not replica.active:
            continue
        loaded = loaded_adapters(replica)
        adapters = []
        for s in served:
            actual = loaded.get(s.adapter.served_name)
            # None where retired, or where placement does not put it (serving.rules.placement_plan).
            desired = desired_root(s, replica.pk, placed[s.pk])
            kept = kept_copies[s.pk].keeps(replica.pk, actual, now)
            state = classify_kept(desired, actual, replica.health, kept=kept)
            adapters.append(
                {
                    "served_name": s.adapter.served_name,
                    "desired_root": desired,
                    "actual_root": actual,
                    "placed": _placed_on(placed[s.pk], replica.pk),
                    # A copy kept for a rollback is as intended: nothing repairs it.
                    "in_sync": state in (SyncState.IN_SYNC, SyncState.KEPT),
                    # Decided on the full roots; a member's view shows folder names only.
                    "state": state.value,
                }
            )
        unknown = [
            {"served_name": name, "actual_root": root}
            for name, root in loaded.items()
            if name not in visible_names and show_unknown
        ]
        replicas.append(
            {
                "base_url": replica.base_url if show_unknown else labels[replica.pk],
                "health": replica.health,
                "vllm_version": replica.vllm_version,
                "last_checked_at": replica.last_checked_at,
                "adapters": adapters,
                "unknown_adapters": unknown,
            }
        )
    fingerprints = {
        f.version_id: f
        for f in VersionFingerprint.objects.filter(
            deployment=deployment, version_id__in=[s.version_id for s in served if s.version_id]
        )
    }
    desired_rows: list[dict[str, Any]] = [
        {
            "adapter_id": s.adapter_id,
            "department": s.adapter.department.slug,
            "served_name": s.adapter.served_name,
            "version": s.version.number if s.version else None,
            "version_id": s.version_id,
            "served_path": s.served_path,
            "estimated_memory_bytes": s.version.estimated_memory_bytes if s.version else 0,
            "fingerprint": _fingerprint(
                fingerprints.get(s.version_id) if s.version_id else None, show_unknown
            ),
        }
        for s in served
    ]
    if not sees_infrastructure(actor):
        for shown in replicas:
            for item in shown["adapters"]:
                item["desired_root"] = _folder_only(item["desired_root"])
                item["actual_root"] = _folder_only(item["actual_root"])
        for row in desired_rows:
            row["served_path"] = _folder_only(row["served_path"])
    slots_used = ServedAdapter.objects.filter(deployment=deployment, version__isnull=False).count()
    return {
        "deployment": deployment.name,
        "last_reconciled_at": deployment.last_reconciled_at,
        "slots_used": slots_used,
        "max_cpu_loras": deployment.max_cpu_loras,
        "desired": desired_rows,
        "replicas": replicas,
    }


def _placed_on(keys: frozenset[int] | None, replica_id: int) -> bool:
    """None: no placement bounds, so every replica."""
    return keys is None or replica_id in keys


def _fingerprint(fingerprint: VersionFingerprint | None, with_replica: bool) -> dict | None:
    """What the version's adapter answers to the probe on this deployment; every
    replica must answer the same (serving/records/fingerprints.py)."""
    if fingerprint is None:
        return None
    body = {**fingerprint.probe, "recorded_at": fingerprint.created_at}
    if with_replica:
        body["recorded_from"] = fingerprint.recorded_from_url
    return body


def drift_events_for(actor: Actor, deployment: Deployment) -> QuerySet[DriftEvent]:
    queryset = deployment.drift_events.select_related("replica")
    if visible_department_ids(actor) is None:
        return queryset
    names = served_adapters_for(actor, deployment).values_list("adapter__served_name", flat=True)
    return queryset.filter(adapter_name__in=list(names))


def kserve_refusal(actor: Actor, deployment: Deployment) -> str:
    """Why `actor` may not download the deployment's KServe manifests, or "".
    They carry the volume's host path, the claim, the namespace, the image and
    whether an API key is set, and name every department's adapters: platform
    admins only."""
    if sees_infrastructure(actor):
        return ""
    return (
        "The KServe manifests name the platform's volumes, namespace and image; "
        "a platform admin can download them."
    )


def kserve_manifests(actor: Actor, deployment: Deployment) -> str:
    from serving.kserve import render_yaml

    refusal = kserve_refusal(actor, deployment)
    if refusal:
        raise NotAuthorized(refusal, code="kserve_forbidden")
    return render_yaml(deployment)


def deployment_placement(actor: Actor, deployment: Deployment) -> list[dict]:
    """Where each adapter the actor may see lives on the deployment, and why
    (serving.rules.placement_plan). Replicas are named by label (replica-1, ...) for
    everyone; platform admins also get their addresses. An adapter without
    bounds is on every active replica; its placement is not stored."""
    from serving.rules.placement_plan import REASON_TEXT, Reason, State, is_bounded

    show_urls = sees_infrastructure(actor)
    labels = replica_labels(deployment)
    replicas = {r.pk: r for r in deployment.replicas.filter(active=True).order_by("base_url")}

    def named(keys) -> list[dict]:
        rows = []
        for key in keys:
            replica = replicas.get(key)
            if replica is None:
                continue
            row = {"label": labels.get(key, "replica"), "health": replica.health}
            if show_urls:
                row["base_url"] = replica.base_url
            rows.append(row)
        return rows

    items = []
    for served in served_adapters_for(actor, deployment).order_by("adapter__served_name"):
        version = served.version
        if version is None:
            continue
        bounded = is_bounded(served.min_replicas, served.max_replicas)
        state = State.from_dict(served.placement) if bounded else None
        if state is None:
            keys: Sequence[int] = list(replicas)
            reason: Reason | None = Reason.EVERYWHERE
            wanted, detail, demand = None, "", None
        else:
            keys, wanted, detail, demand = state.replicas, state.wanted, state.detail, state.demand
            known = {r.value for r in Reason}
            reason = Reason(state.reason) if state.reason in known else None
        placed = named(keys)
        items.append(
            {
                "served_name": served.adapter.served_name,
                "department": served.adapter.department.slug,
                "version": version.number,
                "min_replicas": served.min_replicas,
                "max_replicas": served.max_replicas,
                "wanted": len(placed) if wanted is None else wanted,
                "replicas": placed,
                # Not placed yet (bounds just set): the next reconcile places it.
                "reason": reason.value if reason else "pending",
                "reason_text": REASON_TEXT[reason] if reason else "not placed yet",
                "detail": detail,
                "demand": demand,
            }
        )
    return items


def placement_pending(served: ServedAdapter) -> dict:
    """The placement answer of an adapter whose bounds are set before its first
    promotion: nowhere yet."""
    return {
        "served_name": served.adapter.served_name,
        "department": served.adapter.department.slug,
        "version": None,
        "min_replicas": served.min_replicas,
        "max_replicas": served.max_replicas,
        "wanted": 0,
        "replicas": [],
        "reason": "pending",
        "reason_text": "not served yet: placed at its first promotion",
        "detail": "",
        "demand": None,
    }


def canary_split(rollout: Rollout) -> dict | None:
    """A traffic canary as the API and the page show it: its split, its gates
    and their verdict, the seconds left of its bake; None for other rollouts."""
    canary = getattr(rollout, "canary", None)
    if canary is None or not canary.share:
        return None
    report = canary.gates or {}
    verdict = report.get("verdict") or {}
    until = canary.bake_until
    left = None
    if until is not None and canary.state in CANARY_UNDECIDED:
        left = max(0, int((until - timezone.now()).total_seconds() + 0.999))
    replica = canary.replica

    def side(key):
        data = report.get(key)
        if not data:
            return None
        requests = data["requests"]
        return {**data, "error_rate": data["errors"] / requests if requests else 0.0}

    return {
        "share": canary.share,
        "bake_seconds": canary.bake_seconds,
        "bake_until": until,
        "seconds_left": left,
        "replica": replica.base_url if replica else None,
        "weights": report.get("weights") or {},
        "outcome": canary.outcome,
        "requested": canary.requested,
        "state": canary.state,  # the page's, not the API's (CanarySplitSerializer)
        "verdict": verdict.get("outcome"),
        "reason": verdict.get("reason", ""),
        "canary": side("canary"),
        "baseline": side("baseline"),
        "gates": verdict.get("gates") or [],
        "checked_at": report.get("checked_at"),
        "rollback": report.get("rollback"),
    }
