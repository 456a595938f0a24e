"""Which replicas a deployment has right now: its static list, every A
record of a DNS name (a headless Kubernetes Service), or the ready endpoints
the Kubernetes watch process keeps in the Replica rows
(serving/discovery/kubernetes.py)."""

from __future__ import annotations

import socket

from django.conf import settings
from django.utils import timezone

from serving.models import Deployment, Replica, ReplicaHealth
from serving.vllm_client import VLLMClient


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


def replicas_sync(deployment: Deployment) -> list[Replica]:
    """Upserts Replica rows for what discovery sees; the rest become inactive."""
    if deployment.uses_kubernetes:
        # `manage.py watch_replicas` owns these rows; workers need no API credentials.
        return list(Replica.objects.filter(deployment=deployment, active=True).order_by("base_url"))
    urls = discover_urls(deployment)
    via = "dns" if deployment.replica_dns_name else "static"
    existing = {r.base_url: r for r in deployment.replicas.all()}
    for url in urls:
        replica = existing.get(url)
        if replica is None:
            # Two first rollouts of a deployment discover the same replicas at once;
            # get_or_create takes the other's row instead of failing on the unique key.
            existing[url], _ = Replica.objects.get_or_create(
                deployment=deployment, base_url=url, defaults={"discovered_via": via}
            )
        elif not replica.active:
            replica.active = True
            replica.save(update_fields=["active"])
    # A replica that DNS no longer lists is kept (its history matters) but inactive.
    if deployment.replica_dns_name and not urls:
        return [r for r in existing.values() if r.active]
    Replica.objects.filter(deployment=deployment, active=True).exclude(base_url__in=urls).update(
        active=False
    )
    return [existing[url] for url in urls]


def client_for(replica: Replica, deployment: Deployment, session=None) -> VLLMClient:
    """`session`: a requests.Session to reuse (the client then leaves it open)."""
    return VLLMClient(
        replica.base_url,
        session=session,
        api_key=deployment.vllm_api_key or None,
        timeout=settings.SERVING_HTTP_TIMEOUT_SECONDS,
        connect_timeout=settings.SERVING_CONNECT_TIMEOUT_SECONDS,
        load_timeout=settings.SERVING_LOAD_TIMEOUT_SECONDS,
    )


def mark_health(replica: Replica, *, up: bool, error: str = "", version: str | None = None) -> bool:
    """Records health; returns True when it changed."""
    now = timezone.now()
    previous = replica.health
    replica.health = ReplicaHealth.UP if up else ReplicaHealth.DOWN
    replica.last_checked_at = now
    fields = ["health", "last_checked_at", "last_error"]
    replica.last_error = "" if up else error[:2000]
    if up:
        replica.last_seen_at = now
        fields.append("last_seen_at")
    if version:
        replica.vllm_version = version
        fields.append("vllm_version")
    replica.save(update_fields=fields)
    return previous != replica.health and previous != ReplicaHealth.UNKNOWN
