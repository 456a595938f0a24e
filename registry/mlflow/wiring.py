"""Connects the MLflow integration to the registry's hooks; called once from
RegistryConfig.ready(). Importing the tasks here registers them with Celery
(autodiscovery only looks at `<app>.tasks`)."""

from __future__ import annotations

from registry import hooks


def _after_registered(version) -> None:
    from registry.mlflow import services

    services.record_run_lineage(version)
    services.mirror_version_request(version)


def _after_transition(version, previous: str) -> None:
    from registry.mlflow import services

    services.mirror_version_request(version)


def _health() -> dict:
    from registry.mlflow import services

    return services.mlflow_health()


def connect() -> None:
    import registry.mlflow.tasks  # noqa: F401

    if _after_registered not in hooks.after_version_registered:
        hooks.after_version_registered.append(_after_registered)
    if _after_transition not in hooks.after_version_transition:
        hooks.after_version_transition.append(_after_transition)
    if not any(name == "mlflow" for name, _ in hooks.health_checks):
        hooks.health_checks.append(("mlflow", _health))
