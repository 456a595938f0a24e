"""Serving's answers to other apps' signals (connected in ServingConfig.ready)."""

from __future__ import annotations

import logging

from registry.models import VersionStatus
from serving.enqueue import door_access_enqueue

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
    """A person who leaves keeps no key: revoked in the same transaction, audited.
    The department and service-account keys they issued (and saw once) are
    revoked too with OFFBOARDING_REVOKE_ISSUED_KEYS, else listed for review."""
    from serving.services.inference_keys import leaver_keys_end

    leaver_keys_end(actor=actor, user=user, reason=reason)


def end_service_account_keys(sender, *, actor, account, **kwargs) -> None:
    from serving.models import InferenceKey
    from serving.services.inference_keys import inference_keys_end

    inference_keys_end(
        actor=actor,
        keys=InferenceKey.objects.filter(service_account=account),
        reason="service account deactivated",
    )


def resync_on_membership(sender, *, user, department, **kwargs) -> None:
    """A person's key counts only while they are a member of its department: the
    doors hear of a join or a leave if they hold a live key there."""
    from serving.models import Deployment, InferenceKey

    if InferenceKey.objects.filter(
        person=user, department=department, revoked_at__isnull=True
    ).exists():
        door_access_enqueue(Deployment.objects.values_list("pk", flat=True))


def resync_on_served_change(sender, *, deployment, adapter=None, version=None, **kwargs) -> None:
    """What a deployment serves is what its keys may call there. An adapter
    retired from its last deployment ends its grants (they do not revive)."""
    from serving.services.grants import grants_end_with_adapter

    if adapter is not None and version is None:
        grants_end_with_adapter(adapter)
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
