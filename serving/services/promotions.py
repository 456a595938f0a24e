"""Promoting approved versions to deployments, and the actions that change what
a deployment serves: approve/reject a promotion request, manual rollback, retire."""

from __future__ import annotations

from dataclasses import asdict

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.access import require_approver, require_four_eyes
from core.actors import Actor
from core.audit import audit_event, audit_record, audit_record_all
from core.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from core.models import Ability
from core.state import can_move, move
from registry.models import Adapter, AdapterVersion, VersionStatus
from serving.attestation import require_not_quarantined
from serving.deploy_access import require_may_deploy
from serving.fact_readings import disputes as fact_disputes
from serving.gate import GateReport, check_capacity, evaluate_gate
from serving.models import (
    Canary,
    CanaryState,
    Deployment,
    Promotion,
    PromotionStatus,
    Rollout,
    RolloutKind,
    RolloutStatus,
    ServedAdapter,
)
from serving.rules.transitions import CANARY_UNDECIDED, PROMOTION_TRANSITIONS, ROLLOUT_TERMINAL
from serving.services.rollout_requests import rollout_audit_event, rollout_create


class GateRefused(ApplicationError):
    status = 422
    code = "compatibility_gate_failed"


def _require_undisputed(deployment: Deployment) -> None:
    """Every gate check reads the deployment record (base model, max_loras); while a
    replica reports otherwise, the record cannot be trusted and nothing is promoted."""
    found = fact_disputes(deployment, deployment.replicas.filter(active=True))
    if found:
        facts = sorted({d.fact for d in found})
        raise Conflict(
            f"{deployment.name}'s replicas dispute its record ({', '.join(facts)}): "
            + " ".join(d.message for d in found)
            + " Promotions wait until an admin resolves it.",
            code="replica_facts_disputed",
            details={"disputes": [d.__dict__ for d in found]},
        )


def _require_gate(deployment: Deployment, version: AdapterVersion) -> GateReport:
    require_not_quarantined(deployment)
    _require_undisputed(deployment)
    report = evaluate_gate(deployment, version)
    if not report.passed:
        reasons = " ".join(check.message for check in report.failures)
        raise GateRefused(
            f"Version {version.number} cannot be promoted to {deployment.name}: {reasons}",
            details={"checks": report.as_list()},
        )
    return report


def _require_servable(version: AdapterVersion) -> None:
    if version.status != VersionStatus.APPROVED:
        raise Conflict(
            f"Only approved versions can be served; version {version.number} is {version.status}.",
            code="version_not_approved",
        )


def _start_rollout(
    actor, deployment, version, promotion=None, kind=None, audit=True, canary=None
) -> Rollout:
    served, _ = ServedAdapter.objects.select_for_update(no_key=True).get_or_create(
        deployment=deployment, adapter=version.adapter
    )
    if kind is None:
        kind = RolloutKind.SWAP if served.version_id else RolloutKind.PROMOTE
    in_flight = Rollout.objects.filter(
        deployment=deployment, adapter=version.adapter, target_version=version
    ).exclude(status__in=ROLLOUT_TERMINAL)
    if in_flight.exists():
        raise Conflict(
            f"A rollout of version {version.number} to {deployment.name} is already in progress.",
            code="rollout_in_progress",
        )
    return rollout_create(
        actor=actor,
        deployment=deployment,
        adapter=version.adapter,
        target=version,
        kind=kind,
        # The canary asked for with the promotion is the one the rollout runs.
        canary=canary,
        promotion=promotion,
        audit=audit,
    )


CANARY_MAX_SHARE = 50


def _require_canary_split(share: int, bake: int | None) -> None:
    # The canary is the minority: above half, the old version would be the canary.
    if not 1 <= share <= CANARY_MAX_SHARE:
        raise ValidationFailed(
            f"canary_share is a percentage from 1 to {CANARY_MAX_SHARE}, not {share}.",
            code="invalid_canary_share",
        )
    limit = settings.SERVING_CANARY_MAX_BAKE_SECONDS
    if bake is None or not 1 <= bake <= limit:
        raise ValidationFailed(
            f"canary_bake_seconds is required with canary_share, from 1 to {limit} "
            "(SERVING_CANARY_MAX_BAKE_SECONDS).",
            code="invalid_canary_bake",
        )


def _require_canary_possible(deployment: Deployment, served: ServedAdapter | None) -> None:
    from serving.rollouts.canary import canary_refusal

    replicas = deployment.replicas.filter(active=True).count()
    refusal = canary_refusal(deployment, served.version_id if served else None, replicas)
    capped = served.max_replicas if served is not None else None
    if not refusal and served is not None and capped is not None and capped < 2:
        # The worker pushes to the adapter's placed replicas only (serving.rules.placement_plan):
        # on one, there is no old version left for the split.
        refusal = (
            f"placement holds {served.adapter.served_name} on {capped} replica "
            "(max_replicas); a canary needs one for the new version and at least one "
            "for the old: raise max_replicas to 2 first."
        )
    if refusal:
        raise Conflict(
            f"A traffic canary cannot run on {deployment.name}: {refusal}",
            code="canary_not_possible",
        )


def _recheck_capacity_locked(deployment: Deployment, version: AdapterVersion) -> None:
    """The gate ran before the transaction; two promotions of new adapters at the
    same moment would each see room for one more. Under the deployment's row lock
    (held only to the commit, no HTTP inside) the registered-adapter limit is
    counted again, so concurrent promotions are admitted one at a time."""
    list(
        Deployment.objects.select_for_update(no_key=True).filter(pk=deployment.pk).values_list("pk")
    )
    check = check_capacity(deployment, version)
    if not check.ok:
        raise GateRefused(
            f"Version {version.number} cannot be promoted to {deployment.name}: {check.message}",
            details={"checks": [asdict(check)]},
        )


def promotion_create(
    *,
    actor: Actor,
    deployment: Deployment,
    version: AdapterVersion,
    canary: bool | None = None,
    canary_share: int | None = None,
    canary_bake_seconds: int | None = None,
) -> Promotion:
    """Runs the gate; then either starts the rollout or, where the deployment's
    policy asks for it, waits for a second person's approval. With a
    `canary_share` (percent) and `canary_bake_seconds`, the rollout is a
    traffic canary (serving/rollouts/canary.py)."""
    require_may_deploy(actor, deployment, version.adapter)
    _require_servable(version)
    report = _require_gate(deployment, version)
    canary = deployment.canary_by_default if canary is None else canary
    served = ServedAdapter.objects.filter(deployment=deployment, adapter=version.adapter).first()
    if served and served.version_id == version.pk:
        raise Conflict(
            f"Version {version.number} is already served on {deployment.name}.",
            code="already_served",
        )
    if canary_share is not None:
        canary = True
        _require_canary_split(canary_share, canary_bake_seconds)
        _require_canary_possible(deployment, served)
    department = version.adapter.department  # read now, not under the audit lock
    with transaction.atomic():
        _recheck_capacity_locked(deployment, version)
        if deployment.requires_promotion_approval:
            if Promotion.objects.filter(
                deployment=deployment, version=version, status=PromotionStatus.PENDING_APPROVAL
            ).exists():
                raise Conflict(
                    "A promotion of this version to this deployment already awaits approval.",
                    code="promotion_pending",
                )
            status = PromotionStatus.PENDING_APPROVAL
        else:
            status = PromotionStatus.APPROVED
        promotion = Promotion.objects.create(
            deployment=deployment,
            version=version,
            status=status,
            gate_report=report.as_list(),
            requested_by=actor.user,
            author_ids=sorted(actor.people),
        )
        asked = None
        if canary:
            # One canary, with or without a share of the traffic (Canary).
            asked = Canary.objects.create(
                promotion=promotion,
                share=canary_share,
                bake_seconds=canary_bake_seconds if canary_share is not None else None,
            )
        rollout = None
        if status == PromotionStatus.APPROVED:
            rollout = _start_rollout(
                actor, deployment, version, promotion, audit=False, canary=asked
            )
        # The audit events last, just before the commit: the audit chain's lock
        # is global and held until then (core.audit_chain), so with many
        # promotions at once everything done after taking it is done one at a time.
        # Both at once: one lock, one read of the chain's head.
        events = [
            audit_event(
                actor=actor,
                action="promotion.requested",
                obj=promotion,
                department=department,
                to_state=status,
                details={"deployment": deployment.name, "version": version.number},
            )
        ]
        if rollout is not None:
            events.append(rollout_audit_event(actor, rollout))
        audit_record_all(events)
    return promotion


def _no_longer_reviewable(status: str) -> Conflict:
    return Conflict(
        f"This promotion is {status}; it can no longer be reviewed.",
        code="invalid_transition",
        details={"current_status": status},
    )


FOUR_EYES_PROMOTION = (
    "Four-eyes rule: you cannot approve or reject your own promotion request, nor one "
    "made through a token you minted or a service account you created."
)


def promotion_review(
    *, actor: Actor, promotion: Promotion, approve: bool, comment: str = ""
) -> Promotion:
    """Four-eyes, exactly as for versions: an approver of the department or a
    platform admin who is none of the people behind the request."""
    version = promotion.version
    require_approver(actor, version.adapter.department_id, "Promotion")
    comment = (comment or "").strip()
    if not approve and not comment:
        raise ValidationFailed("A comment is required to reject.", code="comment_required")
    target = PromotionStatus.APPROVED if approve else PromotionStatus.REJECTED
    with transaction.atomic():
        locked = Promotion.objects.select_for_update(no_key=True).get(pk=promotion.pk)
        if locked.status == target or not can_move(PROMOTION_TRANSITIONS, locked.status, target):
            raise _no_longer_reviewable(locked.status)
        require_four_eyes(actor, locked.authors, FOUR_EYES_PROMOTION)
        gate_report = locked.gate_report
        if approve:
            _require_servable(version)
            gate_report = _require_gate(locked.deployment, version).as_list()
        previous = locked.status
        # Compare-and-swap on the status read: a second reviewer who got there
        # first (on a database without row locks) wins, and this one is told.
        if not move(
            locked,
            PROMOTION_TRANSITIONS,
            target,
            reviewed_by=actor.user,
            reviewed_at=timezone.now(),
            comment=comment,
            gate_report=gate_report,
        ):
            locked.refresh_from_db(fields=["status"])
            raise _no_longer_reviewable(locked.status)
        audit_record(
            actor=actor,
            action="promotion.approve" if approve else "promotion.reject",
            obj=locked,
            department=version.adapter.department,
            from_state=previous,
            to_state=target,
            comment=comment,
        )
        if approve:
            asked = Canary.objects.filter(promotion=locked).first()
            _start_rollout(actor, locked.deployment, version, locked, canary=asked)
        else:
            # A canary asked for with a rejected request never runs.
            Canary.objects.filter(promotion=locked, state__in=CANARY_UNDECIDED).update(
                state=CanaryState.ENDED, decided_at=timezone.now()
            )
    return locked


def served_before(deployment: Deployment, adapter: Adapter) -> QuerySet[AdapterVersion]:
    """Versions this deployment has served: the targets of its succeeded rollouts.
    Only these are rollback targets; anything else must go through a promotion
    (and its approval, where the deployment's policy asks for one)."""
    return AdapterVersion.objects.filter(
        pk__in=Rollout.objects.filter(
            deployment=deployment,
            adapter=adapter,
            status=RolloutStatus.SUCCEEDED,
            target_version__isnull=False,
        ).values("target_version")
    )


def rollback_to(
    *, actor: Actor, deployment: Deployment, adapter: Adapter, version: AdapterVersion | None = None
) -> Rollout:
    """Manual rollback to a version this deployment served before (default: the
    one served before the current one). The API and the web pages both call this."""
    require_may_deploy(actor, deployment, adapter, Ability.ROLLBACK)
    served = ServedAdapter.objects.filter(deployment=deployment, adapter=adapter).first()
    if version is None:
        last = (
            Rollout.objects.filter(
                deployment=deployment, adapter=adapter, status=RolloutStatus.SUCCEEDED
            )
            .exclude(previous_version=None)
            .order_by("-finished_at")
            .first()
        )
        if last is None:
            raise Conflict(
                f"{adapter} has no earlier version on {deployment.name} to go back to.",
                code="nothing_to_roll_back_to",
            )
        version = last.previous_version
    assert version is not None  # excluded by the query above
    if version.adapter_id != adapter.pk:
        # Like any name that names nothing: this adapter has no such version.
        raise NotFound("That version belongs to another adapter.", code="wrong_adapter")
    if served and served.version_id == version.pk:
        raise Conflict(f"Version {version.number} is already served.", code="already_served")
    if not served_before(deployment, adapter).filter(pk=version.pk).exists():
        # Otherwise a rollback would skip the four-eyes approval of a promotion.
        raise Conflict(
            f"Version {version.number} was never served on {deployment.name}: a rollback "
            "may only go back to a version this deployment served before; use a promotion.",
            code="not_served_before",
        )
    _require_servable(version)
    _require_gate(deployment, version)
    with transaction.atomic():
        return _start_rollout(actor, deployment, version, kind=RolloutKind.ROLLBACK)


def retire(*, actor: Actor | None, deployment: Deployment, adapter: Adapter) -> Rollout:
    """Stops serving the adapter on the deployment: unload from every replica.
    Its staged folders stay for the grace period."""
    if actor is not None:
        require_may_deploy(actor, deployment, adapter, Ability.RETIRE)
    with transaction.atomic():
        served = (
            ServedAdapter.objects.select_for_update(no_key=True)
            .filter(deployment=deployment, adapter=adapter)
            .first()
        )
        if served is None or served.version_id is None:
            raise Conflict(f"{adapter} is not served on {deployment.name}.", code="not_served")
        served.version = None
        served.served_path = ""
        served.save(update_fields=["version", "served_path", "updated_at"])
        return rollout_create(
            actor=actor,
            deployment=deployment,
            adapter=adapter,
            target=None,
            kind=RolloutKind.RETIRE,
        )


def retire_version_everywhere(version: AdapterVersion) -> None:
    """Registry hook: a deprecated (or archived) version stops being served."""
    for served in ServedAdapter.objects.filter(version=version).select_related("deployment"):
        retire(actor=None, deployment=served.deployment, adapter=version.adapter)
