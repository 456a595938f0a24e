"""The MLflow app's answers to the registry's and serving's signals,
connected once from MlflowBridgeConfig.ready()."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def send_mirror(sender, *, kind: str, pk: int, **kwargs) -> None:
    """A committed mirror row's task (mlflow_bridge.signals.mirror_pending)."""
    from mlflow_bridge import tasks

    task = tasks.sync_version_mirror if kind == "version" else tasks.sync_alias_mirror
    try:
        task.delay(pk)
    except Exception:
        # A broker outage must not turn a committed approval into an error;
        # the row stays pending and the catch-up task finds it.
        logger.exception("could not enqueue the MLflow %s mirror of %s", kind, pk)


def send_webhook(sender, *, delivery_id: int, **kwargs) -> None:
    """An accepted delivery's task (mlflow_bridge.signals.webhook_accepted)."""
    from mlflow_bridge.tasks import handle_webhook

    handle_webhook.delay(delivery_id)


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
    from mlflow_bridge import signals as bridge_signals
    from registry import signals
    from serving.signals import served_version_changed

    signals.version_registered.connect(_after_registered, dispatch_uid="mlflow.registered")
    signals.version_transitioned.connect(_after_transition, dispatch_uid="mlflow.transitioned")
    health_check.connect(_health, dispatch_uid="mlflow.health")
    served_version_changed.connect(_served_version_changed, dispatch_uid="mlflow.alias")
    bridge_signals.mirror_pending.connect(send_mirror, dispatch_uid="mlflow.send_mirror")
    bridge_signals.webhook_accepted.connect(send_webhook, dispatch_uid="mlflow.send_webhook")
