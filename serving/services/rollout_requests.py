"""Rollout requests: record a rollout and enqueue it after commit,
audit it, send its task again, and cancel it.

The worker's side, which stages the artifact and pushes it to the replicas, is
serving/rollouts/engine.py.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from core.access import require_approver
from core.actors import Actor
from core.audit import audit_event, audit_record, audit_record_all
from core.errors import Conflict
from core.models import AuditEvent
from core.state import move
from registry.models import AdapterVersion
from serving.attestation import served_fact
from serving.models import (
    CanaryRequest,
    Deployment,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.rollouts.engine import rollout_enqueue
from serving.services.leases import (
    served_adapter_release_if_expired,
)
from serving.transitions import (
    REPLICA_STEP_UNFINISHED,
    ROLLOUT_TERMINAL,
    ROLLOUT_TRANSITIONS,
)

logger = logging.getLogger(__name__)


def rollout_create(
    *,
    actor: Actor | None,
    deployment: Deployment,
    adapter,
    target: AdapterVersion | None,
    kind: str,
    canary: bool = False,
    promotion=None,
    audit: bool = True,
    canary_share: int | None = None,
    canary_bake_seconds: int | None = None,
) -> Rollout:
    """Records the rollout and enqueues it after commit. Call inside a transaction.
    With audit=False the caller audits it (rollout_audit_created) as the last
    thing before its commit."""
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=adapter,
        kind=kind,
        target_version=target,
        canary=canary,
        canary_share=canary_share,
        canary_bake_seconds=canary_bake_seconds,
        promotion=promotion,
        requested_by=actor.user if actor else None,
        enqueued_at=timezone.now(),
    )
    if audit:
        rollout_audit_created(actor, rollout)
    transaction.on_commit(lambda: rollout_enqueue(rollout.pk))
    return rollout


def rollout_audit_created(actor: Actor | None, rollout: Rollout) -> None:
    audit_record_all([rollout_audit_event(actor, rollout)])


def rollout_audit_event(actor: Actor | None, rollout: Rollout) -> AuditEvent:
    """The event rollout_audit_created records, for a caller that records it
    with its own (core.audit.audit_record_all)."""
    target = rollout.target_version
    return audit_event(
        actor=actor,
        action=f"rollout.{rollout.kind}",
        obj=rollout,
        department=rollout.adapter.department,
        to_state=rollout.status,
        details={
            "deployment": rollout.deployment.name,
            "target_version": target.number if target else None,
            "canary": rollout.canary,
            "canary_share": rollout.canary_share,
            "canary_bake_seconds": rollout.canary_bake_seconds,
            # A retire stops serving when it is requested (promotions.retire):
            # chained here, as a promotion's outcome is at rollout.succeeded.
            **(
                {"served": served_fact(rollout.deployment_id, rollout.adapter_id, None, "")}
                if rollout.kind == RolloutKind.RETIRE
                else {}
            ),
        },
    )


def rollout_cancel(*, actor: Actor, rollout: Rollout, comment: str = "") -> Rollout:
    """Stops an unfinished rollout for good. An approver of the adapter's
    department or a platform admin may; tokens may not.

    The adapter is free again at once: a new promotion is accepted, and the
    desired state is what it was before the rollout, which the reconcile puts
    back on replicas the rollout had already changed. A worker still busy with
    it sees the cancel at its next status change or heartbeat (seconds), stops
    and lets go of its claim; a dead worker's expired claim is cleared here.
    """
    require_approver(actor, rollout.adapter.department_id, "Rollout")
    with transaction.atomic():
        current = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if current.status in ROLLOUT_TERMINAL:
            raise Conflict(
                f"Rollout {rollout.pk} is {current.status}; only an unfinished rollout "
                "can be cancelled.",
                code="invalid_transition",
                details={"status": current.status},
            )
        previous = current.status
        who = actor.user.get_username()
        if not move(
            current,
            ROLLOUT_TRANSITIONS,
            RolloutStatus.CANCELLED,
            cancelled_by=actor.user,
            finished_at=timezone.now(),
            error=f"Cancelled by {who}." + (f" {comment}" if comment else ""),
        ):
            raise Conflict(
                f"Rollout {rollout.pk} changed while it was being cancelled; look again.",
                code="concurrent_change",
            )
        ReplicaRollout.objects.filter(rollout=current, status__in=REPLICA_STEP_UNFINISHED).update(
            status=ReplicaStepStatus.CANCELLED
        )
        audit_record(
            actor=actor,
            action="rollout.cancelled",
            obj=current,
            department=current.adapter.department,
            from_state=previous,
            to_state=RolloutStatus.CANCELLED,
            comment=comment,
        )
        served = ServedAdapter.objects.filter(
            deployment_id=current.deployment_id, adapter_id=current.adapter_id
        ).first()
        if served is not None:
            # A canary's split ends with it: the next sync renders equal weights.
            ServedAdapter.objects.filter(pk=served.pk).update(gateway_weights={})
            served_adapter_release_if_expired(served.pk)
    return current


def rollout_canary_decide(
    *, actor: Actor, rollout: Rollout, request: str, comment: str = ""
) -> Rollout:
    """A person decides a baking canary before its gates do: promote it now
    (the others are swapped to the new version) or abort it (the canary is
    rolled back, a traffic switch). Approvers of the department and platform
    admins; tokens may not. The worker acts on it within a second."""
    require_approver(actor, rollout.adapter.department_id, "Rollout")
    if request not in (CanaryRequest.PROMOTE, CanaryRequest.ABORT):
        raise ValueError(request)
    with transaction.atomic():
        # Compare-and-swap: only a baking canary nobody has decided yet.
        asked = Rollout.objects.filter(
            pk=rollout.pk,
            status=RolloutStatus.BAKING,
            canary_share__isnull=False,
            canary_outcome="",
            canary_request="",
        ).update(canary_request=request, canary_requested_by=actor.user)
        current = Rollout.objects.get(pk=rollout.pk)
        if not asked:
            raise Conflict(
                f"Rollout {rollout.pk} is not a canary that is baking undecided "
                f"(status {current.status}"
                + (f", {current.canary_outcome}" if current.canary_outcome else "")
                + (f", {current.canary_request} asked" if current.canary_request else "")
                + ").",
                code="canary_not_baking",
                details={"status": current.status, "canary_outcome": current.canary_outcome},
            )
        audit_record(
            actor=actor,
            action=f"rollout.canary_{request}_requested",
            obj=current,
            department=current.adapter.department,
            from_state=current.status,
            comment=comment,
        )
    return current
