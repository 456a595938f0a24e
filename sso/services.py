"""Sign-in through the identity provider: find or create the person, then make
their department roles and platform-admin flag say what their groups say.

Runs at every sign-in (and every silent renewal by sso.middleware), so a group
removed at the provider takes the role away at the next one. Each change goes
through the registry's membership services and is audited there, with
`via: sso` and the groups that caused it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.actors import Actor, client_address_of
from core.audit import audit_record
from core.errors import Conflict
from core.middleware import current_request_id
from core.models import Department, Membership
from core.services.departments import membership_grant, membership_revoke
from sso.group_map import GroupMap
from sso.models import Identity

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

# Outside input: a provider (or a misconfigured mapper) may send anything.
MAX_GROUPS = 500
MAX_GROUP_LENGTH = 255
_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


@dataclass
class SignIn:
    user: User
    groups: list[str]
    unmapped: list[str]
    roles: dict[str, str] = field(default_factory=dict)
    changes: int = 0

    @property
    def has_access(self) -> bool:
        return bool(self.user.is_staff or self.user.memberships.exists())


def groups_from_claims(claims: dict) -> list[str]:
    raw = claims.get(settings.OIDC_GROUPS_CLAIM, [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        log.warning("OIDC claim %r is not a list; ignoring it", settings.OIDC_GROUPS_CLAIM)
        return []
    groups = [g for g in raw if isinstance(g, str) and 0 < len(g) <= MAX_GROUP_LENGTH]
    return sorted(set(groups))[:MAX_GROUPS]


class LinkRefused(SuspiciousOperation):
    """A first sign-in whose username names a SCIM-provisioned account that its
    immutable claims do not: neither linked nor created."""

    def __init__(self, account, claim: str):
        self.account = account
        self.claim = claim
        super().__init__(
            f"This provider account's {claim} matches the account {account.get_username()!r} "
            "here, but its subject does not match that account's externalId, and a username "
            "alone never links one. Ask an administrator to check the account's externalId "
            "(OIDC_LINK_CLAIM)."
        )


def sso_sign_in(*, request, issuer: str, claims: dict) -> SignIn:
    """The user for these verified claims (created on first sign-in), synced. One
    transaction: a failure half-way leaves the roles as they were."""
    try:
        try:
            with transaction.atomic():
                return _sign_in(request, issuer, claims)
        except IntegrityError:
            # Two first sign-ins of the same person at once: the other one created them.
            with transaction.atomic():
                return _sign_in(request, issuer, claims)
    except LinkRefused as refused:
        # Recorded after the rollback: nothing else of this sign-in is kept.
        audit_record(
            actor=None,
            action="user.identity_link_refused",
            obj=refused.account,
            department=None,
            details={
                "via": "sso",
                "issuer": issuer,
                "subject": claims["sub"][:255],
                "claim": refused.claim,
                "link_claim": settings.OIDC_LINK_CLAIM,
                "client_address": client_address_of(request),
            },
        )
        raise


def _sign_in(request, issuer: str, claims: dict) -> SignIn:
    groups = groups_from_claims(claims)
    group_map: GroupMap = settings.OIDC_GROUP_MAP
    user, identity = _user_for(request, issuer, claims)
    if not user.is_active:
        # Deactivated here: the callback refuses the sign-in; nothing to sync.
        return SignIn(user=user, groups=groups, unmapped=[])
    actor = Actor(
        user=user,
        request_id=getattr(request, "request_id", "") or current_request_id(),
        client_address=client_address_of(request),
    )
    if hasattr(user, "scim_user"):
        # Provisioned through SCIM: the SCIM groups decide, and a provider whose
        # ID tokens carry no groups claim must not take those roles away here.
        groups = scim_group_names(user)
    result = SignIn(user=user, groups=groups, unmapped=group_map.unmapped(groups))
    result.roles, result.changes = roles_sync(actor=actor, user=user, groups=groups, via="sso")
    Identity.objects.filter(pk=identity.pk).update(groups=groups, last_sign_in_at=timezone.now())
    if result.unmapped:
        log.info("sso: %s has groups no OIDC_GROUP_MAP entry names: %s", user, result.unmapped)
    return result


def scim_group_names(user) -> list[str]:
    return sorted(user.scim_user.groups.values_list("display_name", flat=True))


def roles_sync(*, actor: Actor, user, groups: list[str], via: str) -> tuple[dict[str, str], int]:
    """Makes platform admin and the memberships in mapped departments say what
    these provider groups say (OIDC_GROUP_MAP); audited with `via`. Used by
    sign-in (the groups claim) and by SCIM (the groups the provider pushed).
    Returns ({department: role}, number of changes)."""
    group_map: GroupMap = settings.OIDC_GROUP_MAP
    changes = _sync_admin(actor, user, group_map, groups, via)
    roles, more = _sync_memberships(actor, user, group_map, groups, via)
    return roles, changes + more


def _user_for(request, issuer: str, claims: dict):
    identity = (
        Identity.objects.select_related("user").filter(issuer=issuer, subject=claims["sub"]).first()
    )
    raw_email = claims.get("email")
    email = raw_email if isinstance(raw_email, str) else ""
    if identity is not None:
        user = identity.user
        if email and user.email != email[:254]:
            from core.services.people import user_update

            # The provider's word, recorded: an email decides where notices go.
            user_update(
                actor=Actor(user=user, client_address=client_address_of(request)),
                user=user,
                via="sso",
                email=email[:254],
            )
        return user, identity
    provisioned = _provisioned_for(claims)
    if provisioned is not None:
        identity = Identity.objects.create(user=provisioned, issuer=issuer, subject=claims["sub"])
        audit_record(
            actor=Actor(user=provisioned, client_address=client_address_of(request)),
            action="user.identity_linked",
            obj=provisioned,
            department=None,
            details={"via": "sso", "issuer": issuer, "subject": claims["sub"]},
        )
        return provisioned, identity
    User = get_user_model()
    user = User.objects.create_user(username=_free_username(claims), email=email[:254])
    user.set_unusable_password()  # this person signs in at the provider only
    user.first_name = str(claims.get("given_name") or "")[:150]
    user.last_name = str(claims.get("family_name") or "")[:150]
    user.save()
    identity = Identity.objects.create(user=user, issuer=issuer, subject=claims["sub"])
    audit_record(
        actor=Actor(user=user, client_address=client_address_of(request)),
        action="user.created",
        obj=user,
        department=None,
        details={"via": "sso", "issuer": issuer, "subject": claims["sub"]},
    )
    return user, identity


def _provisioned_for(claims: dict):
    """The SCIM-provisioned account this first sign-in belongs to: its externalId
    is the subject or the configured immutable claim (OIDC_LINK_CLAIM, e.g. Entra
    ID's `oid`). A username is not enough: many providers let people choose
    theirs, so a sign-in whose username names a provisioned account that those
    claims do not is refused (LinkRefused), never linked and never given a second
    account. Accounts already linked to another subject, or deleted through
    SCIM, are never taken."""
    from sso.models import ScimUser

    provisioned = ScimUser.objects.select_related("user").filter(deleted_at__isnull=True)
    free = provisioned.filter(user__sso_identity__isnull=True)
    keys = {claims["sub"]}
    linked = claims.get(settings.OIDC_LINK_CLAIM)
    if isinstance(linked, str) and linked:
        keys.add(linked)
    match = free.filter(external_id__in=sorted(keys)).first()
    if match is not None:
        return match.user
    wanted = claims.get(settings.OIDC_USERNAME_CLAIM)
    if isinstance(wanted, str) and wanted:
        named = provisioned.filter(user__username=wanted).first()
        if named is not None:
            raise LinkRefused(named.user, settings.OIDC_USERNAME_CLAIM)
    return None


def _free_username(claims: dict) -> str:
    """The provider's username if nobody has it; a local account of the same name
    is never taken over (that would hand its memberships to whoever holds the name
    at the provider)."""
    wanted = claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"]
    base = _USERNAME_UNSAFE.sub("-", str(wanted))[:140] or "user"
    User = get_user_model()
    for candidate in [base, *(f"{base}-{n}" for n in range(2, 50))]:
        if not User.objects.filter(username=candidate).exists():
            return candidate
    return f"{base[:100]}-{claims['sub'][:40]}"


def _sync_admin(actor: Actor, user, group_map: GroupMap, groups: list[str], via: str) -> int:
    if not group_map.manages_admin:
        return 0  # no admin group configured: is_staff stays as the Django admin set it
    wanted = group_map.is_admin(groups)
    with transaction.atomic():
        User = get_user_model()
        locked = User.objects.select_for_update(no_key=True).get(pk=user.pk)
        if locked.is_staff == wanted:
            return 0
        locked.is_staff = wanted
        locked.save(update_fields=["is_staff"])
        user.is_staff = wanted
        audit_record(
            actor=actor,
            action="user.admin_granted" if wanted else "user.admin_revoked",
            obj=locked,
            department=None,
            from_state=str(not wanted).lower(),
            to_state=str(wanted).lower(),
            details={
                "via": via,
                "groups": sorted(g for g in groups if g in group_map.admin_groups),
            },
        )
    return 1


def _sync_memberships(actor: Actor, user, group_map: GroupMap, groups: list[str], via: str):
    """Departments named in OIDC_GROUP_MAP follow the provider; memberships in
    other departments (granted by a platform admin) are left alone."""
    wanted = group_map.wanted_roles(groups)
    departments = {
        d.slug: d for d in Department.objects.filter(slug__in=group_map.managed_departments)
    }
    missing = sorted(set(wanted) - set(departments))
    if missing:
        log.warning("OIDC_GROUP_MAP names departments that do not exist: %s", missing)
    changes = 0
    for slug, role in sorted(wanted.items()):
        department = departments.get(slug)
        if department is None:
            continue
        because = sorted(g for g in groups if (slug, role) in group_map.roles.get(g, ()))
        before = Membership.objects.filter(user=user, department=department).first()
        membership_grant(
            actor=actor,
            user=user,
            department=department,
            role=role,
            details={"via": via, "groups": because},
        )
        changes += before is None or before.role != role
    stale = Membership.objects.filter(user=user, department__in=departments.values()).exclude(
        department__slug__in=wanted
    )
    for membership in stale.select_related("department", "user"):
        try:
            membership_revoke(
                actor=actor,
                membership=membership,
                details={"via": via, "reason": "no longer in a mapped group"},
            )
            changes += 1
        except Conflict:
            pass  # a concurrent sign-in removed it first
    return {slug: role for slug, role in wanted.items() if slug in departments}, changes
