"""The one list of events the product tells about: a stable name, a payload
schema version, who is concerned, and how each is read from the audit event
that records its change (the audit log already names every change, in its
transaction). docs/pipelines/webhooks.md lists them for readers.

Payloads carry ids, names, states and the acting person's label: no secret,
no server path (a rollout's error text can name folders on the server; the
link leads to the page that shows it to those who may read it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse

from core.models import AuditEvent

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Kind:
    name: str
    summary: str
    # What a person gets when they have not chosen: "email" or "in_app".
    default: str = "in_app"
    platform: bool = False


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("version.submitted", "A version waits for review", default="email"),
        Kind("version.approved", "A version was approved", default="email"),
        Kind("version.refused", "A version was refused", default="email"),
        Kind("version.deprecated", "A version was deprecated"),
        Kind("version.superseded", "A newer version replaced a version on a deployment"),
        Kind("promotion.awaiting_approval", "A promotion waits for approval", default="email"),
        Kind("rollout.succeeded", "A rollout succeeded"),
        Kind("rollout.failed", "A rollout failed", default="email"),
        Kind("rollout.rolled_back", "A rollout was rolled back", default="email"),
        Kind("rollout.canary_decided", "A canary was decided"),
        Kind("grant.requested", "A grant waits for a decision", default="email"),
        Kind("grant.approved", "A grant was approved", default="email"),
        Kind("grant.refused", "A grant was refused", default="email"),
        Kind("grant.revoked", "A grant was revoked", default="email"),
        Kind("grant.expired", "A grant expired"),
        Kind("grant.expiring", "A grant ends within 7 days", default="email"),
        Kind("key.revoked", "An inference key was revoked", default="email"),
        Kind("key.expiring", "An inference key expires within 7 days", default="email"),
        Kind("webhook.disabled", "A webhook was disabled after failing", default="email"),
        Kind("budget.warning", "A department used 80 % of a token budget"),
        Kind("budget.exhausted", "A department used all of a token budget", default="email"),
        Kind("drift.found", "The reconcile found drift on a replica", platform=True),
        Kind(
            "replica.out_of_sync",
            "A replica stayed out of sync past the bound",
            default="email",
            platform=True,
        ),
    )
}

# For the OpenAPI schema's enum of kinds (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
KIND_CHOICES = [(name, name) for name in KINDS]


@dataclass
class Draft:
    """What an audit event becomes: the outbox row's fields."""

    kind: str
    department_id: int | None
    audience: list[int]
    title: str
    link: str
    data: dict[str, Any]
    people: set[int] = field(default_factory=set)
    approvers_of: list[int] = field(default_factory=list)
    exclude: set[int] = field(default_factory=set)


def might_tell(audit: AuditEvent) -> bool:
    """Whether the audit event's action is one events are read from (no query)."""
    return audit.action in _READERS or audit.action.startswith("rollout.canary_")


def drafts_for(audit: AuditEvent) -> list[Draft]:
    """The events an audit event tells about: most tell nobody, a few tell two
    things (a rollout that succeeded also supersedes the version it replaced)."""
    reader = _READERS.get(audit.action)
    if reader is None and audit.action.startswith("rollout.canary_"):
        reader = _canary if audit.action.removeprefix("rollout.canary_") in _OUTCOMES else None
    if reader is None:
        return []
    found = reader(audit)
    if found is None:
        return []
    return found if isinstance(found, list) else [found]


def payload(draft: Draft, *, uid: str, created_at: str, department_slug: str | None) -> dict:
    return {
        "id": uid,
        "type": draft.kind,
        "version": SCHEMA_VERSION,
        "created_at": created_at,
        "department": department_slug,
        "title": draft.title,
        "link": draft.link,
        "data": draft.data,
    }


# --- Readers: one per family, each loads the rows it names ------------------


def _actor(audit: AuditEvent) -> str:
    # The acting person's username, or "system"; a token's label names the
    # account and its creator, which the department may know, never a secret.
    return audit.actor.get_username() if audit.actor is not None else "system"


_VERSION_KINDS = {
    "version.submit": "version.submitted",
    "version.approve": "version.approved",
    "version.reject": "version.refused",
    "version.deprecate": "version.deprecated",
}


def _version(audit: AuditEvent) -> Draft | None:
    from registry.models import AdapterVersion

    version = (
        AdapterVersion.objects.select_related("adapter__department")
        .filter(pk=audit.object_id)
        .first()
    )
    if version is None:
        return None
    adapter = version.adapter
    kind = _VERSION_KINDS[audit.action]
    verb = {
        "version.submitted": "waits for your review",
        "version.approved": "was approved",
        "version.refused": "was refused",
        "version.deprecated": "was deprecated",
    }[kind]
    draft = Draft(
        kind=kind,
        department_id=adapter.department_id,
        audience=[adapter.department_id],
        title=f"{adapter} version {version.number} {verb}",
        link=reverse("web:version", args=[version.pk]),
        data={
            "adapter": _adapter(adapter),
            "version": {"id": version.pk, "number": version.number, "status": version.status},
            "actor": _actor(audit),
            "comment": audit.comment,
        },
    )
    if kind == "version.submitted":
        draft.approvers_of = [adapter.department_id]
        draft.exclude = set(version.authors)
    else:
        draft.people = _owners(adapter) | {
            i for i in (version.registered_by_id, version.submitted_by_id) if i
        }
    return draft


def _adapter(adapter) -> dict:
    return {
        "id": adapter.pk,
        "name": adapter.name,
        "served_name": adapter.served_name,
        "department": adapter.department.slug,
    }


def _owners(adapter) -> set[int]:
    return set(adapter.owners.values_list("pk", flat=True))


def _promotion(audit: AuditEvent) -> Draft | None:
    from serving.models import Promotion, PromotionStatus

    if audit.to_state != PromotionStatus.PENDING_APPROVAL:
        return None  # approved at once: its rollout tells the rest
    promotion = (
        Promotion.objects.select_related("deployment", "version__adapter__department")
        .filter(pk=audit.object_id)
        .first()
    )
    if promotion is None:
        return None
    version = promotion.version
    adapter = version.adapter
    return Draft(
        kind="promotion.awaiting_approval",
        department_id=adapter.department_id,
        audience=[adapter.department_id],
        title=f"{adapter} version {version.number} waits for approval to go to "
        f"{promotion.deployment.name}",
        link=reverse("web:version", args=[version.pk]),
        data={
            "promotion": {"id": promotion.pk, "status": promotion.status},
            "deployment": promotion.deployment.name,
            "adapter": _adapter(adapter),
            "version": {"id": version.pk, "number": version.number},
            "actor": _actor(audit),
        },
        approvers_of=[adapter.department_id],
        exclude=set(promotion.authors),
    )


_ROLLOUT_KINDS = {
    "rollout.succeeded": ("rollout.succeeded", "succeeded"),
    "rollout.failed": ("rollout.failed", "failed"),
    "rollout.rolled_back": ("rollout.rolled_back", "was rolled back"),
}
_OUTCOMES = {"passed", "failed", "promoted", "aborted"}


def _rollout_draft(audit: AuditEvent, kind: str, verb: str, extra: dict) -> Draft | None:
    from serving.models import Rollout

    rollout = (
        Rollout.objects.select_related(
            "deployment", "adapter__department", "target_version", "previous_version"
        )
        .filter(pk=audit.object_id)
        .first()
    )
    if rollout is None:
        return None
    adapter = rollout.adapter
    people = _owners(adapter)
    if rollout.requested_by_id:
        people.add(rollout.requested_by_id)
    return Draft(
        kind=kind,
        department_id=adapter.department_id,
        audience=[adapter.department_id],
        title=f"Rollout of {adapter} on {rollout.deployment.name} {verb}",
        link=reverse("serving:rollout", args=[rollout.pk]),
        data={
            "rollout": {"id": rollout.pk, "kind": rollout.kind, "status": rollout.status},
            "deployment": rollout.deployment.name,
            "adapter": _adapter(adapter),
            "version": _number(rollout.target_version),
            "previous_version": _number(rollout.previous_version),
            **extra,
        },
        people=people,
    )


def _number(version) -> dict | None:
    return None if version is None else {"id": version.pk, "number": version.number}


def _rollout(audit: AuditEvent) -> list[Draft] | None:
    kind, verb = _ROLLOUT_KINDS[audit.action]
    draft = _rollout_draft(audit, kind, verb, {})
    if draft is None:
        return None
    superseded = _superseded(draft) if kind == "rollout.succeeded" else None
    return [draft] if superseded is None else [draft, superseded]


def _superseded(succeeded: Draft) -> Draft | None:
    """A promotion or swap that succeeded replaced the version the deployment
    served: that version's people hear it is no longer served there. A
    rollback's or a retirement's is no newer version's doing."""
    from registry.models import AdapterVersion
    from serving.models import RolloutKind

    data = succeeded.data
    previous, target = data["previous_version"], data["version"]
    if data["rollout"]["kind"] not in (RolloutKind.PROMOTE, RolloutKind.SWAP):
        return None
    if previous is None or target is None or previous["id"] == target["id"]:
        return None
    version = (
        AdapterVersion.objects.select_related("adapter__department")
        .filter(pk=previous["id"])
        .first()
    )
    if version is None:
        return None
    adapter = version.adapter
    return Draft(
        kind="version.superseded",
        department_id=adapter.department_id,
        audience=[adapter.department_id],
        title=f"{adapter} version {version.number} was superseded by version "
        f"{target['number']} on {data['deployment']}",
        link=reverse("web:version", args=[version.pk]),
        data={
            "adapter": data["adapter"],
            "version": {"id": version.pk, "number": version.number, "status": version.status},
            "superseded_by": target,
            "deployment": data["deployment"],
            "rollout": {"id": data["rollout"]["id"]},
        },
        people=_owners(adapter)
        | {i for i in (version.registered_by_id, version.submitted_by_id) if i},
    )


def _canary(audit: AuditEvent) -> Draft | None:
    outcome = audit.action.removeprefix("rollout.canary_")
    return _rollout_draft(
        audit, "rollout.canary_decided", f"had its canary {outcome}", {"outcome": outcome}
    )


_GRANT_KINDS = {
    "grant.requested": ("grant.requested", "waits for a decision"),
    "grant.approved": ("grant.approved", "was approved"),
    "grant.refused": ("grant.refused", "was refused"),
    "grant.revoked": ("grant.revoked", "was revoked"),
    "grant.expired": ("grant.expired", "expired"),
}


def _grant(audit: AuditEvent) -> Draft | None:
    from serving.models import AdapterGrant

    grant = (
        AdapterGrant.objects.select_related("adapter__department", "department")
        .filter(pk=audit.object_id)
        .first()
    )
    if grant is None:
        return None
    # A request and an expiry are recorded in both sides' logs (serving/services/
    # grants.py): one of them tells, the adapter's department's when there is one.
    told_by = grant.adapter.department_id if grant.adapter else grant.department_id
    if audit.department_id != told_by:
        return None
    kind, verb = _GRANT_KINDS[audit.action]
    if grant.adapter is None and kind == "grant.requested":
        return None  # a name no adapter has: nobody to ask, and the asker knows
    return grant_draft(grant, kind, verb, actor=_actor(audit), comment=audit.comment)


def grant_draft(grant, kind: str, verb: str, *, actor: str, comment: str = "") -> Draft:
    """What the two sides are told. Before the adapter's department decides, the
    asking side learns nothing of the adapter but the name it asked for: a
    request for a name no adapter has (which only its asker sees, and which
    only expires) reads the same to it (docs/security.md, "Grant requests")."""
    adapter = grant.adapter
    answered = adapter is not None and grant.decided_at is not None
    audience = [grant.department_id] if adapter is None else [adapter.department_id]
    if kind != "grant.requested" and adapter is not None:
        # A request waits for the adapter's department only; what follows, both sides hear.
        audience.append(grant.department_id)
    draft = Draft(
        kind=kind,
        department_id=adapter.department_id if answered else grant.department_id,
        audience=audience,
        title=f"{grant.department.slug}'s grant to call {grant.served_name} {verb}",
        link=reverse("serving:department-keys", args=[grant.department.slug]),
        data={
            "grant": {
                "id": grant.pk,
                "status": grant.status,
                "expires_at": grant.expires_at.isoformat(),
            },
            "adapter": _adapter(adapter)
            if answered
            else {"id": None, "name": None, "served_name": grant.served_name, "department": None},
            "grantee": grant.department.slug,
            "actor": actor,
            "comment": comment,
        },
    )
    if kind == "grant.requested" and adapter is not None:
        # Only the adapter's department hears it (_grant: nobody, without an adapter).
        draft.department_id = adapter.department_id
        draft.link = reverse("serving:department-keys", args=[adapter.department.slug])
        draft.data["adapter"] = _adapter(adapter)
        draft.approvers_of = [adapter.department_id]
        draft.exclude = {grant.requested_by_id}
    else:
        draft.people = {grant.requested_by_id}
        draft.link = reverse("serving:department-keys", args=[grant.department.slug])
        if kind in ("grant.revoked", "grant.expiring"):
            draft.approvers_of = [grant.department_id]
    return draft


def _key(audit: AuditEvent) -> Draft | None:
    from serving.models import InferenceKey

    key = InferenceKey.objects.select_related("department").filter(pk=audit.object_id).first()
    if key is None:
        return None
    return key_draft(key, "key.revoked", "was revoked", actor=_actor(audit), reason=audit.comment)


def key_draft(key, kind: str, verb: str, *, actor: str, reason: str = "") -> Draft:
    draft = Draft(
        kind=kind,
        department_id=key.department_id,
        audience=[key.department_id],
        title=f"Inference key {key.name!r} of {key.department.slug} {verb}",
        link=reverse("serving:my-keys")
        if key.person_id
        else reverse("serving:department-keys", args=[key.department.slug]),
        data={
            "key": {
                "id": key.pk,
                "name": key.name,
                "prefix": key.prefix,
                "expires_at": key.expires_at.isoformat(),
            },
            "actor": actor,
            "reason": reason,
        },
    )
    if key.person_id:
        draft.people = {key.person_id}
    else:
        draft.approvers_of = [key.department_id]
    return draft


def _webhook(audit: AuditEvent) -> Draft | None:
    from notifications.models import Webhook

    webhook = Webhook.objects.select_related("department").filter(pk=audit.object_id).first()
    if webhook is None:
        return None
    return Draft(
        kind="webhook.disabled",
        department_id=webhook.department_id,
        audience=[webhook.department_id],
        title=f"A webhook of {webhook.department.slug} was disabled after repeated failures",
        link=reverse("notifications:webhooks", args=[webhook.department.slug]),
        data={"webhook": {"id": webhook.pk, "url": webhook.url}, "reason": audit.comment},
        approvers_of=[webhook.department_id],
    )


# Drift worth a person's attention: what the reconcile could not repair itself,
# or what says the deployment is not what the registry recorded. Repairs that
# worked (reloaded, corrected, unloaded, placed) are in the drift log only.
DRIFT_TOLD = {
    "repair_failed",
    "replica_down",
    "fingerprint_mismatch",
    "fact_disputed",
    "unknown_reported",
}


def drift_draft(drift) -> Draft:
    """A platform event: platform admins are told, no department's webhook."""
    deployment = drift.deployment
    label = drift.get_kind_display()
    on = f" ({drift.adapter_name})" if drift.adapter_name else ""
    return Draft(
        kind="drift.found",
        department_id=None,
        audience=[],
        title=f"{label} on {deployment.name}{on}",
        link=reverse("serving:deployment", args=[deployment.name]),
        data={
            "drift": {"id": drift.pk, "kind": drift.kind, "label": label},
            "deployment": deployment.name,
            "replica": {"id": drift.replica_id},
            "adapter": drift.adapter_name,
        },
    )


# What a budget is called in titles: the doors' words for the limits (serving.rules.quotas).
_PERIODS = {"tokens_per_day": "day", "tokens_per_month": "month"}


def budget_draft(department, *, limit: str, value: int, used: int, threshold: int, window) -> Draft:
    """A department used `threshold` % (80 or 100) of a token budget in the
    window (start, end) that holds now: its approvers are told, and its webhooks."""
    period = _PERIODS[limit]
    spent = threshold >= 100
    verb = "has used all of" if spent else f"has used {threshold} % of"
    return Draft(
        kind="budget.exhausted" if spent else "budget.warning",
        department_id=department.pk,
        audience=[department.pk],
        title=f"{department.slug} {verb} its token budget for the {period}",
        link=reverse("serving:department-keys", args=[department.slug]),
        data={
            "budget": {
                "limit": limit,
                "value": value,
                "used": used,
                "threshold_percent": threshold,
                "period_start": window[0].isoformat(),
                "resets_at": window[1].isoformat(),
            },
        },
        approvers_of=[department.pk],
    )


def out_of_sync_draft(replica, *, since, bound_seconds: int) -> Draft:
    """A platform event: a replica the reconcile has not found up and with
    nothing to repair since `since`. Names the deployment, not the replica's
    address (a server-side URL)."""
    deployment = replica.deployment
    minutes = max(1, round(bound_seconds / 60))
    return Draft(
        kind="replica.out_of_sync",
        department_id=None,
        audience=[],
        title=f"A replica of {deployment.name} has been out of sync for over {minutes} min",
        link=reverse("serving:deployment", args=[deployment.name]),
        data={
            "deployment": deployment.name,
            "replica": {"id": replica.pk, "health": replica.health},
            "out_of_sync_since": since.isoformat(),
            "bound_seconds": bound_seconds,
        },
    )


_READERS: dict[str, Callable[[AuditEvent], Draft | list[Draft] | None]] = {
    **dict.fromkeys(_VERSION_KINDS, _version),
    "promotion.requested": _promotion,
    **dict.fromkeys(_ROLLOUT_KINDS, _rollout),
    **dict.fromkeys(_GRANT_KINDS, _grant),
    "inference_key.revoked": _key,
    "webhook.disabled": _webhook,
}
