"""Which replicas a deployment has right now: its static list, every A
record of a DNS name (a headless Kubernetes Service), or the ready endpoints
the Kubernetes watch process keeps in the Replica rows
(serving/discovery/kubernetes.py)."""

from __future__ import annotations

import socket

from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from serving.models import (
    Deployment,
    Replica,
    ReplicaHealth,
    ReplicaRollout,
    ReplicaStepStatus,
    RolloutStatus,
)


def discover_urls(deployment: Deployment) -> list[str]:
    if deployment.replica_dns_name:
        try:
            infos = socket.getaddrinfo(
                deployment.replica_dns_name,
                deployment.replica_port,
                socket.AF_INET,
                socket.SOCK_STREAM,
            )
        except socket.gaierror:
            return []
        addresses = sorted({info[4][0] for info in infos})
        return [f"{deployment.replica_scheme}://{a}:{deployment.replica_port}" for a in addresses]
    return [url.rstrip("/") for url in deployment.replica_urls or []]


def replicas_sync(deployment: Deployment, *, with_deferred: bool = False) -> list[Replica]:
    """Upserts Replica rows for what discovery sees; the rest become inactive.
    `with_deferred` marks each replica's `has_deferred`: whether a succeeded
    rollout left it a deferred step (the reconcile then completes it)."""
    rows = Replica.objects.filter(deployment=deployment)
    if with_deferred:
        # Only steps whose version is still the one served: a superseded step stays
        # deferred for the record, and must not cost a query on every tick.
        same_version = Q(rollout__adapter__served_in__version=F("rollout__target_version")) | Q(
            rollout__target_version__isnull=True,
            rollout__adapter__served_in__version__isnull=True,
        )
        rows = rows.annotate(
            has_deferred=Exists(
                ReplicaRollout.objects.filter(
                    same_version,
                    replica=OuterRef("pk"),
                    status=ReplicaStepStatus.DEFERRED,
                    rollout__status=RolloutStatus.SUCCEEDED,
                    rollout__adapter__served_in__deployment=OuterRef("deployment_id"),
                )
            )
        )
    if deployment.uses_kubernetes:
        # `manage.py watch_replicas` owns these rows; workers need no API credentials.
        return list(rows.filter(active=True).order_by("base_url"))
    urls = discover_urls(deployment)
    via = "dns" if deployment.replica_dns_name else "static"
    existing = {r.base_url: r for r in rows}
    for url in urls:
        replica = existing.get(url)
        if replica is None:
            # Two first rollouts of a deployment discover the same replicas at once;
            # get_or_create takes the other's row instead of failing on the unique key.
            existing[url], _ = Replica.objects.get_or_create(
                deployment=deployment, base_url=url, defaults={"discovered_via": via}
            )
            # A new row has no deferred steps; with_deferred annotates the others.
            existing[url].has_deferred = False  # type: ignore[attr-defined]
        elif not replica.active:
            replica.active = True
            replica.save(update_fields=["active"])
    # A replica that DNS no longer lists is kept (its history matters) but inactive.
    if deployment.replica_dns_name and not urls:
        return [r for r in existing.values() if r.active]
    gone = [r.pk for url, r in existing.items() if r.active and url not in urls]
    if gone:  # nothing written on the usual tick, where the list is the same
        Replica.objects.filter(pk__in=gone).update(active=False)
        for replica in existing.values():
            if replica.pk in gone:
                replica.active = False
    return [existing[url] for url in urls]


def health_changes(
    replica: Replica, *, up: bool, error: str = "", version: str | None = None, now=None
) -> tuple[dict, bool]:
    """What a poll changes on the replica's row: the columns to write (empty when
    it is as recorded), and whether its health flipped (up <-> down). The
    columns are also set on `replica`. last_checked_at/last_seen_at are not in
    them: the caller writes those for every polled replica in one UPDATE."""
    now = now or timezone.now()
    previous = replica.health
    fields = {
        "health": ReplicaHealth.UP if up else ReplicaHealth.DOWN,
        "last_error": "" if up else (error or "")[:2000],
    }
    if version:
        fields["vllm_version"] = version
    changes = {k: v for k, v in fields.items() if getattr(replica, k) != v}
    for key, value in changes.items():
        setattr(replica, key, value)
    replica.last_checked_at = now
    if up:
        replica.last_seen_at = now
    flipped = previous != replica.health and previous != ReplicaHealth.UNKNOWN
    return changes, flipped
