"""Serving's answers to other apps' signals (connected in ServingConfig.ready)."""

from __future__ import annotations

import logging

from registry.models import VersionStatus

logger = logging.getLogger(__name__)


def retire_when_deprecated(sender, *, version, previous, **kwargs) -> None:
    from serving.services.promotions import retire_version_everywhere

    if version.status in (VersionStatus.DEPRECATED, VersionStatus.ARCHIVED):
        # Retire rollouts are recorded in the transition's transaction and run after commit.
        retire_version_everywhere(version)


def settle_adoptions(sender, *, version, previous, **kwargs) -> None:
    from serving.services.adoptions import adoption_settle

    adoption_settle(version=version)


def hold_after_restore(sender, *, head_event_id, **kwargs) -> list[str]:
    """Rows from a dump serve only what the chain up to the shipped head vouches for."""
    from serving.attestation import quarantine_reason
    from serving.services.restore import deployments_hold_after_restore

    return [
        quarantine_reason(d) or f"{d.name}: matches the audit chain; serving."
        for d in deployments_hold_after_restore(head_event_id=head_event_id)
    ]


# --- Who may call what at the front door (core's signals about callers) -------


def end_person_keys(sender, *, actor, user, reason, **kwargs) -> None:
    """A person who leaves keeps no key: revoked in the same transaction, audited."""
    from serving.models import InferenceKey
    from serving.services.inference_keys import inference_keys_end

    inference_keys_end(
        actor=actor, keys=InferenceKey.objects.filter(person=user), reason=f"person {reason}"
    )


def end_service_account_keys(sender, *, actor, account, **kwargs) -> None:
    from serving.models import InferenceKey
    from serving.services.inference_keys import inference_keys_end

    inference_keys_end(
        actor=actor,
        keys=InferenceKey.objects.filter(service_account=account),
        reason="service account deactivated",
    )


def sync_doors(sender, *, deployment_ids, **kwargs) -> None:
    """The request side changed what doors enforce (serving.signals.door_access_changed)."""
    from serving.tasks import door_access_enqueue

    door_access_enqueue(deployment_ids)


def send_rollout(sender, *, rollout_id: int, **kwargs) -> bool:
    """A committed rollout's task. A broker that is down loses nothing: the
    sweeper sends it again once nobody has picked it up."""
    from serving.tasks import run_rollout

    try:
        run_rollout.delay(rollout_id)
    except Exception:  # kombu raises many types; any of them means "not sent"
        logger.warning(
            "rollout %s: enqueue failed; the sweeper will retry", rollout_id, exc_info=True
        )
        return False
    return True


def reconcile_new_replicas(sender, *, deployment_id: int, **kwargs) -> None:
    """Discovered replicas get what they should serve (serving.signals.replicas_became_ready)."""
    from serving.tasks import reconcile_one

    reconcile_one.delay(deployment_id)


def resync_on_membership(sender, *, user, department, **kwargs) -> None:
    """A person's key counts only while they are a member of its department: the
    doors hear of a join or a leave if they hold a live key there."""
    from serving.models import Deployment, InferenceKey
    from serving.tasks import door_access_enqueue

    if InferenceKey.objects.filter(
        person=user, department=department, revoked_at__isnull=True
    ).exists():
        door_access_enqueue(Deployment.objects.values_list("pk", flat=True))


def resync_on_served_change(sender, *, deployment, **kwargs) -> None:
    """What a deployment serves is what its keys may call there."""
    from serving.tasks import door_access_enqueue

    door_access_enqueue([deployment.pk])


def open_doors(sender, **kwargs):
    """/readyz says which front doors take requests without a key (never the default)."""
    from django.db import DatabaseError

    from serving.models import Deployment

    try:
        names = sorted(Deployment.objects.filter(open_door=True).values_list("name", flat=True))
    except DatabaseError as error:  # the database check says so already
        return "open_doors", {"ok": False, "optional": True, "error": str(error)}
    if not names:
        return "open_doors", {"ok": True, "optional": True}
    notice = f"front door open (no inference key needed): {', '.join(names)}"
    return "open_doors", {"ok": True, "optional": True, "notice": notice}
