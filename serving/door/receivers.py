"""The front door follows every reconcile (connected in ServingConfig.ready)."""

from __future__ import annotations


def sync_after_reconcile(sender, *, deployment, ok, **kwargs) -> None:
    from serving.door.services import door_sync

    if ok:
        door_sync(deployment)
