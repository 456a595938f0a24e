"""Who may call what, as a person sees it: inference keys and grants scoped to
the actor (outsiders get 404), and who may call an adapter and why. The door's
own table is serving.door.selectors.door_access."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from core.access import approver_department_ids, can_see, visible_department_ids
from core.actors import Actor
from core.errors import NotAuthorized, NotFound
from core.models import Department
from registry.models import Adapter
from serving.door.selectors import live_inference_keys
from serving.models import AdapterGrant, Deployment, GrantStatus, InferenceKey, ServedAdapter


def _require_person(actor: Actor) -> None:
    if actor.token is not None:
        raise NotAuthorized(
            "Tokens cannot see or manage inference keys; sign in as a person.",
            code="token_forbidden",
        )


def inference_keys_for(actor: Actor) -> QuerySet[InferenceKey]:
    """A person's own keys, and every key of the departments they approve for
    (all of them for platform admins); `live` says whether the door takes it now."""
    _require_person(actor)
    rows = InferenceKey.objects.select_related(
        "department", "service_account", "person", "created_by", "revoked_by"
    ).annotate(live=Exists(live_inference_keys().filter(pk=OuterRef("pk"))))
    departments = approver_department_ids(actor)
    if departments is None:
        return rows
    return rows.filter(Q(person=actor.user) | Q(department_id__in=departments))


def inference_key_get(actor: Actor, key_id: int) -> InferenceKey:
    key = inference_keys_for(actor).filter(pk=key_id).first()
    if key is None:
        raise NotFound("Inference key not found.")
    return key


def key_status(key: InferenceKey, now=None) -> str:
    """revoked, expired, suspended (its holder left or was deactivated) or active."""
    now = now or timezone.now()
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at <= now:
        return "expired"
    live = getattr(key, "live", None)
    if live is None:
        live = live_inference_keys(now).filter(pk=key.pk).exists()
    return "active" if live else "suspended"


def grants_for(actor: Actor) -> QuerySet[AdapterGrant]:
    """Grants where the actor sees either side: the asking department or the adapter's."""
    rows = AdapterGrant.objects.select_related(
        "adapter__department", "department", "requested_by", "decided_by", "ended_by"
    )
    departments = visible_department_ids(actor)
    if departments is None:
        return rows
    return rows.filter(Q(department_id__in=departments) | Q(adapter__department_id__in=departments))


def adapter_department_shown(actor: Actor, grant: AdapterGrant) -> Department | None:
    """The adapter's department as the grant's page and API show it to `actor`.
    The asking side learns it when that department decides, not before: a
    request for a name no adapter has (which names none) reads the same
    (serving/services/grants.py)."""
    adapter = grant.adapter
    if adapter is None:
        return None
    if grant.decided_at is not None or can_see(actor, adapter.department_id):
        return adapter.department
    return None


def grant_get(actor: Actor, grant_id: int) -> AdapterGrant:
    grant = grants_for(actor).filter(pk=grant_id).first()
    if grant is None:
        raise NotFound("Grant not found.")
    return grant


def live_grants_of(adapter: Adapter) -> list[AdapterGrant]:
    """Its grants asked or approved (approved first), for its page and adapter_callers."""
    return list(
        AdapterGrant.objects.filter(
            adapter=adapter, status__in=[GrantStatus.REQUESTED, GrantStatus.APPROVED]
        )
        .select_related("adapter__department", "department", "requested_by", "decided_by")
        .order_by("status", "department__slug")
    )


def adapter_callers(adapter: Adapter, grants: list[AdapterGrant] | None = None) -> list[dict]:
    """Who may call the adapter at the front doors, and why: its own department
    where a deployment that serves it takes that department, then each approved,
    unexpired grant (#n by X until Y). Three queries, two with `grants`
    (live_grants_of). The caller has already checked that the actor sees the adapter."""
    now = timezone.now()
    if grants is None:
        grants = live_grants_of(adapter)
    serving = list(
        Deployment.objects.filter(
            pk__in=ServedAdapter.objects.filter(adapter=adapter, version__isnull=False).values(
                "deployment_id"
            )
        )
        .prefetch_related("allowed_departments")
        .order_by("name")
    )
    own = [
        d.name
        for d in serving
        if not d.allowed_departments.all()
        or adapter.department_id in {x.pk for x in d.allowed_departments.all()}
    ]
    callers: list[dict[str, object]] = [
        {
            "department": adapter.department.slug,
            "why": "own",
            "grant": None,
            "approved_by": None,
            "expires_at": None,
            "deployments": own,
        }
    ]
    callers += [
        {
            "department": grant.department.slug,
            "why": "grant",
            "grant": grant.pk,
            "approved_by": grant.decided_by.get_username() if grant.decided_by else None,
            "expires_at": grant.expires_at,
            "deployments": [d.name for d in serving],
        }
        for grant in grants
        if grant.status == GrantStatus.APPROVED and grant.expires_at > now
    ]
    return callers
