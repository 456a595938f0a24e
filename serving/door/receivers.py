"""The front door follows every reconcile (connected in ServingConfig.ready)."""

from __future__ import annotations


def sync_after_reconcile(sender, *, deployment, ok, **kwargs) -> None:
    from serving.door.services import gateway_sync

    if ok:
        gateway_sync(deployment)
