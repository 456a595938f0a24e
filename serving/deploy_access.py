"""Who may change what a deployment serves: the predicate pages ask for their
buttons and the services enforce, one rule for both (core.access for the rest)."""

from __future__ import annotations

from core.access import can_contribute, require_contributor
from core.actors import Actor
from core.errors import NotAuthorized
from core.models import Ability
from registry.models import Adapter
from serving.models import Deployment


def department_refusal(deployment: Deployment, adapter: Adapter) -> str:
    """Why the deployment refuses the adapter's department, or ""."""
    allowed = [d.pk for d in deployment.allowed_departments.all()]
    if allowed and adapter.department_id not in allowed:
        return (
            f"Deployment {deployment.name} does not accept adapters from {adapter.department.slug}."
        )
    return ""


def deploy_refusal(
    actor: Actor, deployment: Deployment, adapter: Adapter, ability: str = Ability.PROMOTE
) -> str:
    """Why this person may not promote (roll back, retire) the adapter on the
    deployment, or "": what a disabled option says."""
    if not can_contribute(actor, adapter.department_id, ability):
        return "You may not change what serves this department's adapters."
    return department_refusal(deployment, adapter)


def can_deploy(
    actor: Actor, deployment: Deployment, adapter: Adapter, ability: str = Ability.PROMOTE
) -> bool:
    return not deploy_refusal(actor, deployment, adapter, ability)


def require_may_deploy(
    actor: Actor, deployment: Deployment, adapter: Adapter, ability: str = Ability.PROMOTE
) -> None:
    """`ability` is what a token needs: promote, roll back and retire are separate
    abilities, so a pipeline allowed to ship cannot also take adapters down."""
    require_contributor(actor, adapter.department_id, ability, "Version")
    reason = department_refusal(deployment, adapter)
    if reason:
        raise NotAuthorized(reason, code="department_not_allowed")
