from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from core.access import require_contributor
from core.actors import Actor
from core.audit import audit_record
from core.errors import Conflict, ReferenceNotFound, ValidationFailed
from core.models import Ability, Department, Membership
from registry.models import Adapter


def _validation_message(error: ValidationError) -> str:
    if hasattr(error, "message_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in error.message_dict.items())
    return " ".join(error.messages)


def _owners_in_department(department: Department, usernames: list[str]) -> list:
    users = list(get_user_model().objects.filter(username__in=usernames, is_active=True))
    missing = set(usernames) - {u.username for u in users}
    if missing:
        # Like every other name a request refers to (its department, a deployment):
        # one that names nobody is not found.
        raise ReferenceNotFound(
            f"Unknown owners: {', '.join(sorted(missing))}.", code="owner_not_found"
        )
    members = set(
        Membership.objects.filter(department=department, user__in=users).values_list(
            "user__username", flat=True
        )
    )
    outsiders = {u.username for u in users if not u.is_staff} - members
    if outsiders:
        raise ValidationFailed(
            f"Owners must belong to {department.slug}: {', '.join(sorted(outsiders))}.",
            code="bad_owner",
        )
    return users


def _require_own_served_name_prefix(department: Department, served_name: str) -> None:
    """A served name starting with another department's slug and '-' ("legal-..."
    from Finance) would read as that department's adapter to every client and
    key holder: refused by the rule alone, before anything is looked up, so the
    answer says nothing about which names exist."""
    lowered = served_name.lower()
    claimed = [
        slug
        for slug in Department.objects.exclude(pk=department.pk).values_list("slug", flat=True)
        if lowered.startswith(f"{slug.lower()}-")
    ]
    # A longer own slug ("finance-eu" beside "finance") owns its own prefix.
    if claimed and not lowered.startswith(f"{department.slug.lower()}-"):
        raise ValidationFailed(
            f"The served name {served_name!r} starts with another department's prefix "
            f"({claimed[0]}-); served names may start with {department.slug}- or with no "
            "department's prefix.",
            code="served_name_prefix",
        )


def adapter_create(
    *,
    actor: Actor,
    department: Department,
    name: str,
    base_model: str,
    description: str = "",
    served_name: str | None = None,
    owners: list[str] | None = None,
) -> Adapter:
    require_contributor(actor, department.pk, Ability.CREATE_ADAPTERS, "Department")
    adapter = Adapter(
        department=department,
        name=name,
        base_model=base_model,
        description=description,
        served_name=served_name or name,
        created_by=actor.user,
    )
    try:
        # Uniqueness is a conflict (409), not bad input: checked below and by the database.
        adapter.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        raise ValidationFailed(_validation_message(error)) from None
    _require_own_served_name_prefix(department, adapter.served_name)
    if Adapter.objects.filter(department=department, name=name).exists():
        raise Conflict(
            "Adapter with this Department and Name already exists. "
            f"{department.name} already has an adapter named {name!r}.",
            code="duplicate_name",
        )
    if Adapter.objects.filter(served_name=adapter.served_name).exists():
        raise Conflict(
            f"The served name {adapter.served_name!r} is taken; served names are unique "
            "across the registry. Choose another served_name.",
            code="served_name_taken",
        )
    owner_users = _owners_in_department(department, owners) if owners else [actor.user]
    try:
        with transaction.atomic():
            adapter.save()
            adapter.owners.set(owner_users)
            audit_record(
                actor=actor,
                action="adapter.created",
                obj=adapter,
                department=department,
                details={"served_name": adapter.served_name, "base_model": base_model},
            )
    except IntegrityError:
        raise Conflict(
            f"An adapter named {name!r} or served as {adapter.served_name!r} already exists."
        ) from None
    return adapter


def adapter_update(
    *,
    actor: Actor,
    adapter: Adapter,
    description: str | None = None,
    owners: list[str] | None = None,
) -> Adapter:
    """Only descriptive fields change; name, served_name and base model are
    identity that running deployments depend on."""
    require_contributor(actor, adapter.department_id, Ability.CREATE_ADAPTERS, "Adapter")
    changed: dict = {}
    with transaction.atomic():
        if description is not None and description != adapter.description:
            adapter.description = description
            adapter.save(update_fields=["description", "updated_at"])
            changed["description"] = True
        if owners is not None:
            adapter.owners.set(_owners_in_department(adapter.department, owners))
            changed["owners"] = sorted(owners)
        if changed:
            audit_record(
                actor=actor,
                action="adapter.updated",
                obj=adapter,
                department=adapter.department,
                details=changed,
            )
    return adapter
