"""Reads for the serving control plane, restricted by the actor's departments."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from core.access import visible_department_ids
from core.actors import Actor
from core.errors import NotAuthorized, NotFound
from serving.models import (
    Deployment,
    DriftEvent,
    HttpAttempt,
    Promotion,
    ReplicaRollout,
    Rollout,
    ServedAdapter,
)


def deployments_for(actor: Actor) -> QuerySet[Deployment]:
    """Everyone signed in may read deployments (not their secrets)."""
    return Deployment.objects.prefetch_related("replicas", "allowed_departments")


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
            "deployment", "version__adapter__department", "requested_by", "reviewed_by"
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
        ).prefetch_related(Prefetch("replica_steps", queryset=steps)),
        actor,
        "adapter__department_id",
    )


def rollout_get(actor: Actor, rollout_id: int) -> Rollout:
    rollout = rollouts_for(actor).filter(pk=rollout_id).first()
    if rollout is None:
        raise NotFound("Rollout not found.")
    return rollout


def deployment_state(actor: Actor, deployment: Deployment) -> dict:
    """Desired (the database) against actual (what each replica said at the
    last reconcile), per adapter the actor may see."""
    served = list(served_adapters_for(actor, deployment))
    visible_names = {s.adapter.served_name for s in served}
    show_unknown = visible_department_ids(actor) is None
    replicas = []
    for replica in deployment.replicas.all():
        if not replica.active:
            continue
        loaded = {item["id"]: item.get("root") for item in replica.loaded_adapters or []}
        adapters = []
        for s in served:
            actual = loaded.get(s.adapter.served_name)
            desired = s.served_path if s.version_id else None
            adapters.append(
                {
                    "served_name": s.adapter.served_name,
                    "desired_root": desired,
                    "actual_root": actual,
                    "in_sync": desired == actual,
                }
            )
        unknown = [
            {"served_name": name, "actual_root": root}
            for name, root in loaded.items()
            if name not in visible_names and show_unknown
        ]
        replicas.append(
            {
                "base_url": replica.base_url,
                "health": replica.health,
                "vllm_version": replica.vllm_version,
                "last_checked_at": replica.last_checked_at,
                "adapters": adapters,
                "unknown_adapters": unknown,
            }
        )
    desired = [
        {
            "adapter_id": s.adapter_id,
            "department": s.adapter.department.slug,
            "served_name": s.adapter.served_name,
            "version": s.version.number if s.version else None,
            "version_id": s.version_id,
            "served_path": s.served_path,
            "estimated_memory_bytes": s.version.estimated_memory_bytes if s.version else 0,
        }
        for s in served
    ]
    slots_used = ServedAdapter.objects.filter(deployment=deployment, version__isnull=False).count()
    return {
        "deployment": deployment.name,
        "last_reconciled_at": deployment.last_reconciled_at,
        "slots_used": slots_used,
        "max_cpu_loras": deployment.max_cpu_loras,
        "desired": desired,
        "replicas": replicas,
    }


def drift_events_for(actor: Actor, deployment: Deployment) -> QuerySet[DriftEvent]:
    queryset = deployment.drift_events.select_related("replica")
    if visible_department_ids(actor) is None:
        return queryset
    names = served_adapters_for(actor, deployment).values_list("adapter__served_name", flat=True)
    return queryset.filter(adapter_name__in=list(names))


def kserve_refusal(actor: Actor, deployment: Deployment) -> str:
    """Why `actor` may not download the deployment's KServe manifests, or "".
    They name every promoted adapter of every department, so a member gets them
    only when all of those are in departments they belong to."""
    ids = visible_department_ids(actor)
    if ids is None:
        return ""
    allowed = {d.pk for d in deployment.allowed_departments.all()}
    if allowed and not allowed & ids:
        return "Your departments may not use this deployment."
    others = (
        ServedAdapter.objects.filter(deployment=deployment, version__isnull=False)
        .exclude(adapter__department_id__in=ids)
        .exists()
    )
    if others:
        return (
            "The manifests name adapters of departments you are not a member of; "
            "a platform admin can download them."
        )
    return ""


def kserve_manifests(actor: Actor, deployment: Deployment) -> str:
    from serving.kserve import render_yaml

    refusal = kserve_refusal(actor, deployment)
    if refusal:
        raise NotAuthorized(refusal, code="kserve_forbidden")
    return render_yaml(deployment)
