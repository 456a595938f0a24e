"""After a restore, a deployment serves again only once the audit chain vouches
for it (serving/attestation.py), or a platform admin acknowledges the difference.

`audit_verify --expect-head <head> --restored` (core) holds every deployment on
the shipped head's event: the rows came from a dump, which whoever had the
backup could have edited to point a replica at their own address (the vLLM key
would go there) or to serve other weights. A deployment whose rows match the
chain up to that head is released at once, with a chained snapshot; the others
stay held, saying why, until `deployment_restore_acknowledge`.
docs/operators/retention.md#restoring.
"""

from __future__ import annotations

from django.db import transaction

from core.access import require_platform_admin
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict
from serving.attestation import differences, snapshot_of
from serving.models import Deployment, Replica


def deployments_hold_after_restore(*, head_event_id: int) -> list[Deployment]:
    """Holds every deployment on the chain up to `head_event_id`, then checks
    each: released (audited `deployment.restore_attested`) where the rows match,
    held with its differences (audited `deployment.restore_held`) elsewhere."""
    with transaction.atomic():
        # Every row, whatever the dump said about holds: this runs after the restore.
        Deployment.objects.update(restore_basis=head_event_id, restore_differences=[])
        # A dump's replica rows prove nothing (the front door routes to the active
        # ones): discovery finds them again from the chained fields, the reconcile
        # for static URLs and DNS, `manage.py watch_replicas` for Kubernetes.
        Replica.objects.filter(active=True).update(active=False)
    return [restore_check(deployment=d) for d in Deployment.objects.order_by("name")]


def restore_check(*, deployment: Deployment) -> Deployment:
    """Compares a held deployment with the chain again (after an admin put a
    replica URL back, say); releases it if they match."""
    basis = deployment.restore_basis
    if basis is None:
        return deployment
    found = differences(deployment, basis)
    with transaction.atomic():
        # Compare-and-swap on the basis: an acknowledgement meanwhile stands.
        if not found:
            released = Deployment.objects.filter(pk=deployment.pk, restore_basis=basis).update(
                restore_basis=None, restore_differences=[]
            )
            if released:
                audit_record(
                    actor=None,
                    action="deployment.restore_attested",
                    obj=deployment,
                    department=None,
                    details={"through_event": basis, **snapshot_of(deployment)},
                )
        else:
            changed = found != deployment.restore_differences and (
                Deployment.objects.filter(pk=deployment.pk, restore_basis=basis).update(
                    restore_differences=found
                )
            )
            if changed:
                audit_record(
                    actor=None,
                    action="deployment.restore_held",
                    obj=deployment,
                    department=None,
                    details={"through_event": basis, "differences": found},
                )
    deployment.refresh_from_db()
    return deployment


def deployment_restore_acknowledge(
    *, actor: Actor, deployment: Deployment, comment: str = ""
) -> Deployment:
    """A platform admin accepts what a held deployment's rows say after a
    restore. The event names the differences and chains a snapshot of the rows,
    so a later restore's check finds these replicas and versions named."""
    require_platform_admin(actor)
    with transaction.atomic():
        current = Deployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
        if current.restore_basis is None:
            raise Conflict(f"{current.name} is not quarantined after a restore.", code="not_held")
        found = differences(current, current.restore_basis)
        Deployment.objects.filter(pk=current.pk).update(restore_basis=None, restore_differences=[])
        audit_record(
            actor=actor,
            action="deployment.restore_acknowledged",
            obj=current,
            department=None,
            comment=comment,
            details={
                "through_event": current.restore_basis,
                "differences": found,
                **snapshot_of(current),
            },
        )
    current.refresh_from_db()
    return current
