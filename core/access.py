"""Who may see and do what. Every face of the product (API, admin, web UI,
tasks) asks these functions; none re-implements them.

`can_*` answer yes or no (for buttons and templates); `require_*` raise the
error a caller shows. Outsiders get NotFound, not NotAuthorized: a department's
adapters are not even confirmed to exist to people outside it.
"""

from __future__ import annotations

from core.actors import Actor
from core.errors import NotAuthorized, NotFound
from core.models import Ability, Membership, Role

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
    if "visible" not in actor._memo:
        actor._memo["visible"] = frozenset(
            Membership.objects.filter(user=actor.user).values_list("department_id", flat=True)
        )
    return set(actor._memo["visible"])


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


def can_see(actor: Actor, department_id: int) -> bool:
    return role_in(actor, department_id) is not None


def can_contribute(actor: Actor, department_id: int, ability: str) -> bool:
    """Members, approvers and admins; a token only with the named ability."""
    if not can_see(actor, department_id):
        return False
    return actor.token is None or ability in actor.token.abilities


def can_approve(actor: Actor, department_id: int) -> bool:
    """Approvers of the department and platform admins; never a token."""
    return actor.token is None and role_in(actor, department_id) in {Role.APPROVER, ADMIN}


def can_promote(actor: Actor, department_id: int) -> bool:
    """Whether a Promote button is shown: contributors with the promote ability.
    Where to (a deployment's allowed departments) is the promote page's to say."""
    return can_contribute(actor, department_id, Ability.PROMOTE)


def require_visible(actor: Actor, department_id: int, what: str) -> None:
    if not can_see(actor, department_id):
        raise NotFound(f"{what} not found.")


def require_contributor(actor: Actor, department_id: int, ability: str, what: str) -> None:
    require_visible(actor, department_id, what)
    if not can_contribute(actor, department_id, ability):
        label = Ability(ability).label if ability in Ability.values else ability
        raise NotAuthorized(
            f"This token lacks the ability '{ability}' ({label}).",
            code="missing_ability",
        )


def token_may(actor: Actor, ability: str) -> bool:
    """People may (their roles decide); a token only with the named ability."""
    return actor.token is None or ability in actor.token.abilities


def require_token_ability(actor: Actor, ability: str) -> None:
    if not token_may(actor, ability):
        label = Ability(ability).label if ability in Ability.values else ability
        raise NotAuthorized(
            f"This token lacks the ability '{ability}' ({label}).", code="missing_ability"
        )


def require_approver(actor: Actor, department_id: int, what: str) -> None:
    require_visible(actor, department_id, what)
    if actor.token is not None:
        raise NotAuthorized(
            "API tokens can never approve, reject, deprecate or archive versions, "
            "nor review promotions; a person must.",
            code="token_forbidden",
        )
    if not can_approve(actor, department_id):
        raise NotAuthorized(
            "Only an approver of this department or a platform admin may do this.",
            code="not_an_approver",
        )


def can_review(actor: Actor, authors) -> bool:
    """Four-eyes: `actor` is none of `authors`, the user ids of every person
    behind the work (Actor.people at each act: who acted, who minted the token,
    who created the service account). Versions and promotions both ask this."""
    return actor.user.pk not in set(authors)


def require_four_eyes(actor: Actor, authors, message: str) -> None:
    if not can_review(actor, authors):
        raise NotAuthorized(message, code="four_eyes")


def require_platform_admin(actor: Actor) -> None:
    if not actor.is_platform_admin:
        raise NotAuthorized("Only platform admins may do this.", code="not_platform_admin")
