"""The registry's answers to core's signals, connected once from RegistryConfig.ready()."""

from __future__ import annotations


def _health(sender, **kwargs):
    from registry.artifact_store import get_artifact_store
    from registry.storage import StorageError

    try:
        get_artifact_store().check()
    except StorageError as error:
        return "artifact_store", {"ok": False, "error": str(error)}
    return "artifact_store", {"ok": True}


def connect() -> None:
    from core.signals import health_check

    health_check.connect(_health, dispatch_uid="registry.health")
