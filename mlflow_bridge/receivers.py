"""The MLflow app's answers to the registry's and serving's signals,
connected once from MlflowBridgeConfig.ready()."""

from __future__ import annotations


def _after_registered(sender, *, version, **kwargs) -> None:
    from mlflow_bridge.lineage import record_run_lineage
    from mlflow_bridge.mirror import mirror_version_request

    record_run_lineage(version)
    mirror_version_request(version)


def _after_transition(sender, *, version, previous, **kwargs) -> None:
    from mlflow_bridge.mirror import mirror_version_request

    mirror_version_request(version)


def _health(sender, **kwargs):
    from mlflow_bridge.mirror import mlflow_health

    return "mlflow", mlflow_health()


def _served_version_changed(sender, *, deployment, adapter, version, **kwargs) -> None:
    from mlflow_bridge.mirror import mirror_alias_clear, mirror_alias_set

    # MLflow answers "what is in production?" with what the deployment serves.
    if version is None:
        mirror_alias_clear(deployment=deployment, adapter=adapter)
    else:
        mirror_alias_set(deployment=deployment, adapter=adapter, version=version)


def connect() -> None:
    from core.signals import health_check
    from registry import signals
    from serving.signals import served_version_changed

    signals.version_registered.connect(_after_registered, dispatch_uid="mlflow.registered")
    signals.version_transitioned.connect(_after_transition, dispatch_uid="mlflow.transitioned")
    health_check.connect(_health, dispatch_uid="mlflow.health")
    served_version_changed.connect(_served_version_changed, dispatch_uid="mlflow.alias")
