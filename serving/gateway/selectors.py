"""The routing table of a deployment, read from the database (two queries)."""

from __future__ import annotations

from django.utils import timezone

from serving.gateway.routing import ReplicaView, RoutingTable, ServedView, routing_table
from serving.models import Deployment, Replica, ReplicaHealth, ServedAdapter
from serving.sync_state import loaded_from


def routing_table_for(deployment: Deployment) -> RoutingTable:
    now = timezone.now()
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
