"""What a deployment's front door needs from the database: its routing table
(two queries) and its access table (four), each a bounded number of queries
whatever the number of replicas, adapters or keys."""

from __future__ import annotations

from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from core.models import Department, Membership
from serving.attestation import quarantine_reason
from serving.door.callers import CallerKey, DoorAccess
from serving.door.routing import ReplicaView, RoutingTable, ServedView, routing_table
from serving.models import (
    AdapterGrant,
    Deployment,
    GrantStatus,
    InferenceKey,
    Replica,
    ReplicaHealth,
    ServedAdapter,
)
from serving.quota_selectors import department_limits, key_limits, limited_now
from serving.rules.quotas import door_rpm
from serving.sync_state import loaded_from


def routing_table_for(deployment: Deployment) -> RoutingTable:
    now = timezone.now()
    # A deployment quarantined after a restore has no servers behind its door: the door
    # would send the vLLM key to URLs the audit chain does not vouch for yet.
    quarantined = bool(quarantine_reason(deployment))
    replicas = [
        ReplicaView(
            id=row["pk"],
            base_url=row["base_url"],
            down=row["health"] == ReplicaHealth.DOWN,
            loaded=loaded_from(row["loaded_adapters"] or []),
        )
        for row in Replica.objects.filter(deployment=deployment, active=True).values(
            "pk", "base_url", "health", "loaded_adapters"
        )
        if not quarantined
    ]
    served = [
        ServedView(
            name=row["adapter__served_name"],
            path=row["served_path"],
            held=row["lease_until"] is not None and row["lease_until"] > now,
            weights=row["gateway_weights"] or {},
        )
        for row in ServedAdapter.objects.filter(
            deployment=deployment, version__isnull=False
        ).values("adapter__served_name", "served_path", "lease_until", "gateway_weights")
    ]
    return routing_table(
        deployment=deployment.name,
        base_model=deployment.base_model_name,
        replicas=replicas,
        served=served,
    )


def live_inference_keys(now=None):
    """Keys the door takes now: not revoked, not expired, and held by someone
    still there: a person active and still a member of the key's department (or
    a platform admin), a service account of that department not deactivated."""
    now = now or timezone.now()
    member = Membership.objects.filter(user=OuterRef("person"), department=OuterRef("department"))
    return InferenceKey.objects.filter(revoked_at__isnull=True, expires_at__gt=now).filter(
        Q(person__isnull=True)
        | (Q(person__is_active=True) & (Q(person__is_staff=True) | Exists(member))),
        Q(service_account__isnull=True)
        | Q(
            service_account__deactivated_at__isnull=True,
            service_account__user__is_active=True,
            service_account__department=F("department"),
        ),
    )


def door_access(deployment: Deployment) -> DoorAccess:
    """The table the deployment's front door enforces (serving/door/callers.py),
    in six queries whatever the number of keys, departments or grants (and
    metering's, for tokens, where a token limit is set).

    Each department that may use the deployment (allowed_departments; empty:
    every one) may call the base model and its own adapters served here; a
    department with an approved, unexpired grant may call that adapter where it
    is served, whatever allowed_departments says (the adapter's department
    agreed). Every live key is listed: one whose department may call nothing
    here is a known caller answered 404, not an unknown one."""
    now = timezone.now()
    live = live_inference_keys(now)
    keys = {
        row["secret_sha256"]: CallerKey(
            key_id=row["pk"],
            department=row["department__slug"],
            expires_at=int(row["expires_at"].timestamp()),
        )
        for row in live.values("pk", "secret_sha256", "department__slug", "expires_at")
    }
    per_key = key_limits(live)
    per_department = department_limits()
    through = Deployment.allowed_departments.through.objects.filter(deployment_id=deployment.pk)
    users = set(
        Department.objects.filter(
            ~Exists(through) | Exists(through.filter(department_id=OuterRef("pk")))
        ).values_list("slug", flat=True)
    )
    served = list(
        ServedAdapter.objects.filter(deployment=deployment, version__isnull=False).values_list(
            "adapter__served_name", "adapter__department__slug", "version_id"
        )
    )
    granted = AdapterGrant.objects.filter(
        status=GrantStatus.APPROVED,
        expires_at__gt=now,
        adapter__served_in__deployment=deployment,
        adapter__served_in__version__isnull=False,
    ).values_list("department__slug", "adapter__served_name", "expires_at")
    allowed = {(slug, deployment.base_model_name) for slug in users}
    allowed |= {(owner, name) for name, owner, _ in served if owner in users}
    grant_ends: dict[tuple[str, str], int] = {}
    for slug, name, expires_at in granted:
        if (slug, name) not in allowed:
            ends = int(expires_at.timestamp())
            grant_ends[(slug, name)] = max(ends, grant_ends.get((slug, name), 0))
    allowed |= set(grant_ends)
    return DoorAccess(
        deployment=deployment.name,
        open=deployment.open_door,
        keys=keys,
        allowed=frozenset(allowed),
        upstream_key="" if quarantine_reason(deployment) else deployment.vllm_api_key,
        versions={name: version for name, _, version in served},
        rpm=door_rpm(per_key, per_department),
        limited=limited_now(per_key, per_department, now),
        grant_ends=grant_ends,
    )
