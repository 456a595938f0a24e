"""Rollout requests: record a rollout and enqueue it after commit,
audit it, send its task again, and cancel it.

The worker's side, which stages the artifact and pushes it to the replicas, is
serving/rollouts/engine.py.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from core.access import can_approve, require_approver
from core.actors import Actor
from core.audit import audit_event, audit_record, audit_record_all
from core.errors import Conflict
from core.models import AuditEvent
from core.state import can_move, move
from registry.models import AdapterVersion
from serving.attestation import served_fact
from serving.enqueue import rollout_enqueue
from serving.models import (
    Canary,
    CanaryRequest,
    CanaryState,
    Deployment,
    ReplicaRollout,
    ReplicaStepStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.records.leases import (
    served_adapter_release_if_expired,
)
from serving.rules.transitions import (
    CANARY_TRANSITIONS,
    CANARY_UNDECIDED,
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
    canary: Canary | None = None,
    promotion=None,
    audit: bool = True,
) -> Rollout:
    """Records the rollout and enqueues it after commit. Call inside a transaction.
    A `canary` (asked for with the promotion) becomes this rollout's. With
    audit=False the caller audits it (rollout_audit_created) as the last thing
    before its commit."""
    rollout = Rollout.objects.create(
        deployment=deployment,
        adapter=adapter,
        kind=kind,
        target_version=target,
        promotion=promotion,
        requested_by=actor.user if actor else None,
        enqueued_at=timezone.now(),
    )
    if canary is not None:
        canary.rollout = rollout
        canary.save(update_fields=["rollout"])
    # Its canary (or none) is known: reading it again (the audit) asks nothing.
    Rollout.canary.related.set_cached_value(rollout, canary)
    if audit:
        rollout_audit_created(actor, rollout)
    rollout_enqueue(rollout.pk)
    return rollout


def rollout_audit_created(actor: Actor | None, rollout: Rollout) -> None:
    audit_record_all([rollout_audit_event(actor, rollout)])


def rollout_audit_event(actor: Actor | None, rollout: Rollout) -> AuditEvent:
    """The event rollout_audit_created records, for a caller that records it
    with its own (core.audit.audit_record_all)."""
    target = rollout.target_version
    canary = getattr(rollout, "canary", None)
    return audit_event(
        actor=actor,
        action=f"rollout.{rollout.kind}",
        obj=rollout,
        department=rollout.adapter.department,
        to_state=rollout.status,
        details={
            "deployment": rollout.deployment.name,
            "target_version": target.number if target else None,
            "canary": canary is not None,
            "canary_share": canary.share if canary else None,
            "canary_bake_seconds": canary.bake_seconds if canary else None,
            # A retire stops serving when it is requested (promotions.retire):
            # chained here, as a promotion's outcome is at rollout.succeeded.
            **(
                {"served": served_fact(rollout.deployment_id, rollout.adapter_id, None, "")}
                if rollout.kind == RolloutKind.RETIRE
                else {}
            ),
        },
    )


def can_act_on_rollout(actor: Actor, rollout: Rollout) -> bool:
    """Whether `actor` may cancel `rollout` or decide its canary: an approver of
    the adapter's department or a platform admin, and a person (tokens never).
    require_approver, which rollout_cancel and rollout_canary_decide call, refuses
    exactly these and says why."""
    return actor.token is None and can_approve(actor, rollout.adapter.department_id)


def rollout_cancellable(rollout: Rollout) -> bool:
    """An unfinished rollout can be cancelled (rollout_cancel checks this under
    its row lock; the page asks it for the button)."""
    return rollout.status not in ROLLOUT_TERMINAL


def canary_decidable(rollout: Rollout) -> bool:
    """A person may promote or abort a traffic canary while it bakes undecided
    (CANARY_TRANSITIONS: baking -> promote_asked, abort_asked)."""
    canary = getattr(rollout, "canary", None)
    return (
        canary is not None
        and canary.share is not None
        and can_move(CANARY_TRANSITIONS, canary.state, CanaryState.PROMOTE_ASKED)
    )


def can_cancel_rollout(actor: Actor, rollout: Rollout) -> bool:
    return rollout_cancellable(rollout) and can_act_on_rollout(actor, rollout)


def can_decide_canary(actor: Actor, rollout: Rollout) -> bool:
    return canary_decidable(rollout) and can_act_on_rollout(actor, rollout)


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
        current = Rollout.objects.select_for_update(no_key=True).get(pk=rollout.pk)
        if not rollout_cancellable(current):
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
        # Its canary ends undecided, whatever a person had asked of it.
        Canary.objects.filter(rollout=current, state__in=CANARY_UNDECIDED).update(
            state=CanaryState.ENDED, decided_at=timezone.now()
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
    asked: dict[str, str] = {
        CanaryRequest.PROMOTE: CanaryState.PROMOTE_ASKED,
        CanaryRequest.ABORT: CanaryState.ABORT_ASKED,
    }
    if request not in asked:
        raise ValueError(request)
    with transaction.atomic():
        current = Rollout.objects.select_related("canary").get(pk=rollout.pk)
        canary = getattr(current, "canary", None)
        # Compare-and-swap on the canary's state: only a baking canary nobody has
        # decided yet; the gates deciding in the same second win or lose cleanly.
        decided = (
            canary is not None
            and canary_decidable(current)
            and move(
                canary, CANARY_TRANSITIONS, asked[request], field="state", decided_by=actor.user
            )
        )
        if not decided:
            if canary is not None:
                canary.refresh_from_db(fields=["state"])
            state = canary.state if canary is not None else ""
            shown = "" if state in ("", CanaryState.WAITING, CanaryState.BAKING) else state
            raise Conflict(
                f"Rollout {rollout.pk} is not a canary that is baking undecided "
                f"(status {current.status}"
                + (f", {shown.replace('_', ' ')}" if shown else "")
                + ").",
                code="canary_not_baking",
                details={
                    "status": current.status,
                    "canary_outcome": canary.outcome if canary is not None else "",
                },
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
