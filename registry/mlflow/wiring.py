"""Connects the MLflow integration to the registry's and serving's signals;
called once from RegistryConfig.ready(). Importing the tasks here registers
them with Celery (autodiscovery only looks at `<app>.tasks`)."""

from __future__ import annotations


def _after_registered(sender, *, version, **kwargs) -> None:
    from registry.mlflow import services

    services.record_run_lineage(version)
    services.mirror_version_request(version)


def _after_transition(sender, *, version, previous, **kwargs) -> None:
    from registry.mlflow import services

    services.mirror_version_request(version)


def _health(sender, **kwargs):
    from registry.mlflow import services

    return "mlflow", services.mlflow_health()


def _served_version_changed(sender, *, deployment, adapter, version, **kwargs) -> None:
    from registry.mlflow.services import mirror_alias_clear, mirror_alias_set

    # MLflow answers "what is in production?" with what the deployment serves.
    if version is None:
        mirror_alias_clear(deployment_name=deployment.name, adapter=adapter)
    else:
        mirror_alias_set(deployment_name=deployment.name, adapter=adapter, version=version)


def connect() -> None:
    import registry.mlflow.tasks  # noqa: F401
    from core.signals import health_check
    from registry import signals
    from serving.signals import served_version_changed

    signals.version_registered.connect(_after_registered, dispatch_uid="mlflow.registered")
    signals.version_transitioned.connect(_after_transition, dispatch_uid="mlflow.transitioned")
    health_check.connect(_health, dispatch_uid="mlflow.health")
    served_version_changed.connect(_served_version_changed, dispatch_uid="mlflow.alias")
