"""Links from a version's lineage to where it came from."""

from __future__ import annotations

from django.conf import settings


def run_ui_url(experiment_id: str, run_id: str) -> str:
    """The run's page in the MLflow UI, or "" when MLflow is not configured."""
    base = getattr(settings, "MLFLOW_UI_URL", "") or settings.MLFLOW_TRACKING_URI
    if not (base and experiment_id and run_id):
        return ""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
