"""Issue 21, item 2: MLflow runs belong to departments, through the experiments
a platform admin allowed for each (admin, API, audited, like the S3 sources).

Before: any member could register another department's run by its id (its
weights, params, metrics, tags), and the error for a wrong artifact path listed
that foreign run's tree. Against the real MLflow server."""

from __future__ import annotations

import uuid

import pytest

from core.models import AuditEvent
from mlflow_bridge.models import AllowedExperiment
from registry.models import AdapterVersion
from tests.factories import make_adapter
from tests.mlflow_bridge.conftest import TrainingRun, log_run

pytestmark = pytest.mark.mlflow


def finance_run(tracking, tmp_path) -> tuple[str, str]:
    """A run in Finance's own experiment, which Legal was never allowed."""
    experiment_id = tracking.create_experiment(f"finance-{uuid.uuid4().hex[:8]}")
    run_id = tracking.create_run(experiment_id).info.run_id
    folder = tmp_path / f"finance-{run_id}"
    folder.mkdir()
    for name, data in TrainingRun().spec.files().items():
        (folder / name).write_bytes(data)
    tracking.log_artifacts(run_id, str(folder), "adapter")
    tracking.log_param(run_id, "secret_param", "finance-only")
    tracking.set_terminated(run_id, "FINISHED")
    return experiment_id, run_id


def register(client, adapter, run_id, artifact_path="adapter"):
    return client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
        {"run_id": run_id, "artifact_path": artifact_path},
        format="json",
    )


def test_another_departments_run_is_a_run_that_does_not_exist(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    _, run_id = finance_run(tracking, tmp_path)

    for artifact_path in ("adapter", "not-there"):
        response = register(as_token, adapter, run_id, artifact_path)
        assert response.status_code == 404, response.json()
        error = response.json()["error"]
        assert error["code"] == "run_not_found"
        # The same answer as for an id MLflow never issued: no tree, no params.
        assert "adapter_config.json" not in str(response.json())
        assert "finance-only" not in str(response.json())
    unknown = register(as_token, adapter, "0" * 32).json()["error"]
    assert unknown["message"].replace("0" * 32, run_id) == error["message"]
    assert not AdapterVersion.objects.exists()


def test_a_platform_admin_allows_an_experiment_and_the_department_registers_from_it(
    mlflow_on, tracking, as_root, fred, finance, tmp_path
):
    experiment_id, run_id = finance_run(tracking, tmp_path)
    ledger = make_adapter(fred, finance, name=f"ledger-{uuid.uuid4().hex[:8]}")
    from tests.conftest import client_for

    as_fred = client_for(fred)
    assert register(as_fred, ledger, run_id).status_code == 404

    by_name = tracking.get_experiment(experiment_id).name
    allowed = as_root.post(
        "/api/v1/mlflow-experiments/",
        {"department": "finance", "experiment": by_name},
        format="json",
    )
    assert allowed.status_code == 201, allowed.json()
    assert allowed.json()["experiment_id"] == experiment_id
    event = AuditEvent.objects.get(action="mlflow_experiment.allowed")
    assert event.department == finance and event.details["experiment_id"] == experiment_id

    assert register(as_fred, ledger, run_id).status_code == 201

    grant = AllowedExperiment.objects.get(department=finance)
    assert as_root.delete(f"/api/v1/mlflow-experiments/{grant.pk}/").status_code == 204
    assert AuditEvent.objects.filter(action="mlflow_experiment.disallowed").exists()


def test_only_platform_admins_allow_experiments(mlflow_on, tracking, as_alex, as_token, tmp_path):
    run_id = log_run(tracking, tmp_path)
    experiment_id = tracking.get_run(run_id).info.experiment_id
    for client in (as_alex, as_token):
        response = client.post(
            "/api/v1/mlflow-experiments/",
            {"department": "legal", "experiment": experiment_id},
            format="json",
        )
        assert response.status_code == 403
        assert client.get("/api/v1/mlflow-experiments/").status_code == 403


def test_an_unknown_experiment_is_refused(mlflow_on, as_root, legal):
    response = as_root.post(
        "/api/v1/mlflow-experiments/",
        {"department": "legal", "experiment": f"nope-{uuid.uuid4().hex}"},
        format="json",
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "experiment_not_found"
