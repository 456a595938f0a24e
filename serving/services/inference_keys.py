"""Inference keys: what a client sends to a deployment's front door.

Issued for a department, one of its service accounts, or a person (for
themselves); shown once, stored as the SHA-256 of the secret (256 random bits:
nothing to brute-force, so no slow hash), expiring, revocable, audited in the
transaction of the change. Every change is sent to the front doors after commit
(serving.enqueue.door_access_enqueue); what a key may call there is
serving.door.selectors.door_access.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.access import can_approve, require_visible, role_in
from core.actors import Actor
from core.audit import audit_event, audit_record, audit_record_all
from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import Department, ServiceAccount
from core.services.service_accounts import service_account_lock_active
from core.services.tokens import hash_token_secret
from serving.enqueue import door_access_enqueue
from serving.models import Deployment, InferenceKey

KEY_PREFIX = "lsk_"  # noqa: S105 - a public marker, not a secret
HOLDERS = ("department", "service_account", "person")


def hash_inference_key(secret: str) -> str:
    """What the door computes from the Bearer value: SHA-256, lowercase hex,
    the same digest the API tokens are kept as."""
    return hash_token_secret(secret)


def _require_person(actor: Actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot manage inference keys; sign in as a person.", code="token_forbidden"
        )


def may_issue(actor: Actor, department_id: int, holder: str) -> bool:
    """Approvers of the department and platform admins issue its keys and its
    service accounts'; a member issues a key for themselves."""
    if actor.token is not None:
        return False
    if holder == "person":
        return role_in(actor, department_id) is not None
    return can_approve(actor, department_id)


def may_revoke(actor: Actor, key: InferenceKey) -> bool:
    """Its person, approvers of its department, platform admins."""
    if actor.token is not None:
        return False
    return key.person_id == actor.user.pk or can_approve(actor, key.department_id)


def lifetime_days(days, limit: int) -> int:
    """`expires_in_days` of a key or a grant: a whole number from 1 to `limit`."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= limit:
        raise ValidationFailed(
            f"expires_in_days must be a whole number between 1 and {limit}.", code="bad_expiry"
        )
    return days


def inference_key_issue(
    *,
    actor: Actor,
    department: Department,
    name: str,
    expires_in_days: int,
    holder: str = "department",
    service_account: ServiceAccount | None = None,
) -> tuple[InferenceKey, str]:
    """Writes the key and returns it with its secret, which is never stored,
    logged or shown again. `holder` "person" is the actor themselves."""
    _require_person(actor)
    require_visible(actor, department.pk, "Department")
    if holder not in HOLDERS:
        raise ValidationFailed(f"holder must be one of {', '.join(HOLDERS)}.", code="bad_holder")
    if not may_issue(actor, department.pk, holder):
        raise NotAuthorized(
            "Only an approver of this department or a platform admin issues its keys; "
            "a member may issue a key for themselves.",
            code="not_an_approver",
        )
    if holder == "service_account":
        if service_account is None or service_account.department_id != department.pk:
            raise NotFound("Service account not found.", code="reference_not_found")
    elif service_account is not None:
        raise ValidationFailed(
            "A service account is named only with holder 'service_account'.", code="bad_holder"
        )
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A key needs a name.", code="bad_name")
    days = lifetime_days(expires_in_days, settings.SERVING_INFERENCE_KEY_MAX_DAYS)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        if service_account is not None:  # holder "service_account", checked above
            # Locked and read again: a deactivation of the account waits for
            # this key, or this key sees the deactivation.
            service_account = service_account_lock_active(service_account)
        key = InferenceKey.objects.create(
            department=department,
            service_account=service_account if holder == "service_account" else None,
            person=actor.user if holder == "person" else None,
            name=name[:100],
            prefix=secret[: len(KEY_PREFIX) + 8],
            secret_sha256=hash_inference_key(secret),
            created_by=actor.user,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit_record(
            actor=actor,
            action="inference_key.issued",
            obj=key,
            department=department,
            details={
                "prefix": key.prefix,
                "holder": holder_label(key),
                "expires_at": key.expires_at.isoformat(),
            },
        )
        _doors_change()
    return key, secret


def inference_key_revoke(*, actor: Actor, key: InferenceKey, reason: str = "") -> InferenceKey:
    _require_person(actor)
    require_visible_key(actor, key)
    if not may_revoke(actor, key):
        raise NotAuthorized(
            "Only the key's person, an approver of its department or a platform admin "
            "may revoke it.",
            code="not_an_approver",
        )
    now = timezone.now()
    with transaction.atomic():
        # Compare-and-swap on "not revoked": a second revoke is told, not re-recorded.
        if not InferenceKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=actor.user, revoked_reason=(reason or "").strip()[:200]
        ):
            raise Conflict("This key is already revoked.", code="already_revoked")
        key.refresh_from_db()
        audit_record(
            actor=actor,
            action="inference_key.revoked",
            obj=key,
            department=key.department,
            comment=key.revoked_reason,
            details={"prefix": key.prefix},
        )
        _doors_change()
    return key


def require_visible_key(actor: Actor, key: InferenceKey) -> None:
    """Outsiders (and members who are not its person) learn nothing of it."""
    if key.person_id == actor.user.pk and actor.token is None:
        return
    if not can_approve(actor, key.department_id):
        raise NotFound("Inference key not found.")


def holder_label(key: InferenceKey) -> str:
    if key.service_account_id:
        return f"service account {key.service_account}"
    if key.person is not None:
        return f"person {key.person.get_username()}"
    return f"department {key.department.slug}"


def inference_keys_end(*, actor: Actor | None, keys, reason: str) -> list[str]:
    """Revokes these keys at once (a person deactivated, a service account
    ended), each audited; the caller's transaction commits them. Returns their prefixes.

    Every key's row is locked and written before the audit chain is taken (the
    order of every audited write, docs/internals/architecture.md): a revoke of
    one of them at the same moment holds its row while it waits for the chain."""
    now = timezone.now()
    with transaction.atomic():
        ending = list(
            keys.filter(revoked_at__isnull=True)
            .select_related("department")
            .select_for_update(no_key=True, of=("self",))
            .order_by("pk")
        )
        if not ending:
            return []
        InferenceKey.objects.filter(pk__in=[key.pk for key in ending]).update(
            revoked_at=now, revoked_by=actor.user if actor else None, revoked_reason=reason[:200]
        )
        audit_record_all(
            [
                audit_event(
                    actor=actor,
                    action="inference_key.revoked",
                    obj=key,
                    department=key.department,
                    comment=reason,
                    details={"prefix": key.prefix},
                )
                for key in ending
            ]
        )
    _doors_change()
    return [key.prefix for key in ending]


def inference_keys_issued_by(user):
    """The working keys `user` issued to a department or to one of its service
    accounts: they outlive the person (up to SERVING_INFERENCE_KEY_MAX_DAYS),
    and the person saw each secret once."""
    return InferenceKey.objects.filter(
        created_by=user, person__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).select_related("department", "service_account")


def leaver_keys_end(*, actor: Actor | None, user, reason: str) -> dict[str, list[str]]:
    """Offboarding (core.services.people.user_access_end, in its transaction):
    the person's own keys end; the keys they issued to departments and service
    accounts end too with OFFBOARDING_REVOKE_ISSUED_KEYS, else they are kept and
    listed in one audited event (`user.issued_keys_kept`) for review. One
    revoke for all of them: every row before the audit chain (inference_keys_end)."""
    issued = list(inference_keys_issued_by(user).order_by("department__slug", "prefix"))
    ending = InferenceKey.objects.filter(person=user)
    if settings.OFFBOARDING_REVOKE_ISSUED_KEYS and issued:
        ending = InferenceKey.objects.filter(Q(person=user) | Q(pk__in=[key.pk for key in issued]))
    revoked = inference_keys_end(actor=actor, keys=ending, reason=f"person {reason}")
    if settings.OFFBOARDING_REVOKE_ISSUED_KEYS or not issued:
        return {"revoked": revoked, "kept": []}
    _issued_keys_kept(actor, user, issued)
    return {"revoked": revoked, "kept": [key.prefix for key in issued]}


def _issued_keys_kept(actor: Actor | None, user, keys: list[InferenceKey]) -> None:
    audit_record(
        actor=actor,
        action="user.issued_keys_kept",
        obj=user,
        department=None,
        comment="Inference keys this person issued still work; revoke them if they should not.",
        details={
            "keys": [
                {
                    "prefix": key.prefix,
                    "name": key.name,
                    "department": key.department.slug,
                    "service_account": key.service_account.name if key.service_account else None,
                    "expires_at": key.expires_at.isoformat(),
                }
                for key in keys
            ]
        },
    )


def _doors_change() -> None:
    """Every live key is in every door's table: all of them hear of it."""
    door_access_enqueue(Deployment.objects.values_list("pk", flat=True))
