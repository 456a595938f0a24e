"""Who may see and do what. Every face of the product (API, admin, web UI,
tasks) asks these functions; none re-implements them.

Outsiders get NotFound, not NotAuthorized: a department's adapters are not even
confirmed to exist to people outside it.
"""

from __future__ import annotations

from registry.actors import Actor
from registry.errors import NotAuthorized, NotFound
from registry.models import Ability, Membership, Role

ADMIN = "admin"


def role_in(actor: Actor, department_id: int) -> str | None:
    """ "admin", "approver", "member" or None. Tokens act as members of their department."""
    if actor.is_platform_admin:
        return ADMIN
    if actor.token is not None:
        return Role.MEMBER if actor.token.department_id == department_id else None
    if department_id not in actor._roles:
        actor._roles[department_id] = (
            Membership.objects.filter(user=actor.user, department_id=department_id)
            .values_list("role", flat=True)
            .first()
        )
    return actor._roles[department_id]


def visible_department_ids(actor: Actor) -> set[int] | None:
    """None means every department (platform admins)."""
    if actor.is_platform_admin:
        return None
    if actor.token is not None:
        return {actor.token.department_id}
    return set(Membership.objects.filter(user=actor.user).values_list("department_id", flat=True))


def approver_department_ids(actor: Actor) -> set[int] | None:
    if actor.is_platform_admin:
        return None
    if actor.token is not None:
        return set()
    return set(
        Membership.objects.filter(user=actor.user, role=Role.APPROVER).values_list(
            "department_id", flat=True
        )
    )


def require_visible(actor: Actor, department_id: int, what: str) -> None:
    if role_in(actor, department_id) is None:
        raise NotFound(f"{what} not found.")


def require_contributor(actor: Actor, department_id: int, ability: str, what: str) -> None:
    """Members, approvers and admins; a token only with the named ability."""
    require_visible(actor, department_id, what)
    if actor.token is not None and ability not in actor.token.abilities:
        label = Ability(ability).label if ability in Ability.values else ability
        raise NotAuthorized(
            f"This token lacks the ability '{ability}' ({label}).",
            code="missing_ability",
        )


def require_approver(actor: Actor, department_id: int, what: str) -> None:
    require_visible(actor, department_id, what)
    if actor.token is not None:
        raise NotAuthorized(
            "API tokens can never approve, reject or retire.", code="token_forbidden"
        )
    if role_in(actor, department_id) not in {Role.APPROVER, ADMIN}:
        raise NotAuthorized(
            "Only an approver of this department or a platform admin may do this.",
            code="not_an_approver",
        )


def require_platform_admin(actor: Actor) -> None:
    if not actor.is_platform_admin:
        raise NotAuthorized("Only platform admins may do this.", code="not_platform_admin")
