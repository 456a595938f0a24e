"""POST /api/v1/adapters/{id}/versions/from-mlflow-run/ against a real MLflow
server, with the artifact landing in a real S3 store."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from registry.models import AdapterVersion
from tests.mlflow_bridge.conftest import GIT_COMMIT, TrainingRun, log_run
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.mlflow


def url(adapter) -> str:
    return f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/"


def staging_is_empty() -> bool:
    root = Path(settings.INGEST_STAGING_DIR)
    return not root.exists() or not any(root.iterdir())


def test_it_registers_a_finished_run_with_its_lineage(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store, django_capture_on_commit_callbacks
):
    run_id = log_run(tracking, tmp_path)

    with django_capture_on_commit_callbacks(execute=True):
        response = as_token.post(
            url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json"
        )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["number"] == 1
    assert body["artifact_uri"].startswith("s3://")
    assert body["warnings"] == []
    lineage = body["lineage"]
    experiment_id = tracking.get_run(run_id).info.experiment_id
    assert lineage["mlflow_run_id"] == run_id
    assert lineage["mlflow_run_uri"] == f"runs:/{run_id}/adapter"
    assert lineage["mlflow_run_url"] == (
        f"{mlflow_on.url}/#/experiments/{experiment_id}/runs/{run_id}"
    )
    assert lineage["mlflow_experiment_name"] == "legal-adapters"
    assert lineage["mlflow_artifact_path"] == "adapter"
    assert lineage["run_name"] == "lora-contracts"
    assert lineage["source_commit"] == GIT_COMMIT
    assert (lineage["dataset"], lineage["dataset_digest"]) == ("contracts-2026-q3", "a1b2c3d4")
    assert lineage["run_base_model"] == "tiny-llama"
    assert lineage["run_metrics"] == {"eval_loss": 0.42, "train_loss": 0.31}
    assert lineage["run_params"]["learning_rate"] == "0.0002"
    assert lineage["warnings"] == []
    # The files went through the normal ingest: parsed metadata and hashes.
    assert body["r"] == 8 and body["base_model_name_or_path"] == "tiny-llama"
    assert {f["path"] for f in body["files"]} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert staging_is_empty()


def test_the_same_run_twice_returns_the_existing_version(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    run_id = log_run(tracking, tmp_path)
    body = {"run_id": run_id, "artifact_path": "adapter"}

    first = as_token.post(url(adapter), body, format="json")
    second = as_token.post(url(adapter), body, format="json")

    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert AdapterVersion.objects.filter(adapter=adapter).count() == 1


def test_a_retry_with_another_artifact_path_is_a_conflict(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    run_id = log_run(tracking, tmp_path)
    as_token.post(url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json")

    response = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "other"}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "run_already_registered"


def test_a_tar_gz_logged_as_one_file_is_registered(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    run_id = log_run(tracking, tmp_path, TrainingRun(as_archive=True, artifact_path="packed"))

    response = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "packed/adapter.tar.gz"}, format="json"
    )

    assert response.status_code == 201, response.json()
    assert response.json()["lineage"]["mlflow_artifact_path"] == "packed/adapter.tar.gz"


def test_an_unknown_run_is_a_404(mlflow_on, adapter, as_token):
    response = as_token.post(
        url(adapter), {"run_id": "0" * 32, "artifact_path": "adapter"}, format="json"
    )

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"


def test_a_missing_artifact_path_is_a_400_listing_what_the_run_contains(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    run_id = log_run(tracking, tmp_path)

    response = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "lora"}, format="json"
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "artifact_path_not_found"
    assert "adapter/adapter_config.json" in error["message"]
    assert error["details"]["run_contents"] == [
        "adapter/",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ]
    assert not AdapterVersion.objects.exists()
    assert staging_is_empty()


def test_only_finished_runs_are_accepted(mlflow_on, tracking, adapter, as_token, tmp_path):
    running = log_run(tracking, tmp_path, TrainingRun(status="RUNNING"))
    failed = log_run(tracking, tmp_path, TrainingRun(status="FAILED"))

    for run_id, status in [(running, "RUNNING"), (failed, "FAILED")]:
        response = as_token.post(
            url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json"
        )
        assert response.status_code == 409
        assert response.json()["error"]["details"] == {"run_status": status}
    assert not AdapterVersion.objects.exists()


def test_a_base_model_disagreement_is_warned_and_recorded(
    mlflow_on, tracking, adapter, as_token, tmp_path
):
    run_id = log_run(tracking, tmp_path, TrainingRun(base_model="meta-llama/Llama-3.1-8B"))

    response = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json"
    )

    assert response.status_code == 201
    warning = (
        "The run says its base model is 'meta-llama/Llama-3.1-8B', but the adapter's "
        "base_model_name_or_path is 'tiny-llama'."
    )
    assert warning in response.json()["warnings"]
    version = AdapterVersion.objects.get(pk=response.json()["id"])
    assert version.lineage_warnings == [warning]
    assert version.run_base_model == "meta-llama/Llama-3.1-8B"


def test_a_bad_artifact_in_a_run_leaves_nothing_behind(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store
):
    files = AdapterSpec().files()
    files["adapter_model.bin"] = files.pop("adapter_model.safetensors")
    run_id = log_run(tracking, tmp_path, TrainingRun(files=files))

    response = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json"
    )

    assert response.status_code == 400
    assert "safetensors" in response.json()["error"]["message"]
    assert not AdapterVersion.objects.exists()
    assert s3_store.list_prefix("adapters/") == []
    assert staging_is_empty()


def test_the_snapshot_outlives_the_run(mlflow_on, tracking, adapter, as_token, tmp_path):
    run_id = log_run(tracking, tmp_path)
    created = as_token.post(
        url(adapter), {"run_id": run_id, "artifact_path": "adapter"}, format="json"
    ).json()

    tracking.set_tag(run_id, "mlflow.source.git.commit", "rewritten")
    tracking.delete_run(run_id)

    again = as_token.get(f"/api/v1/versions/{created['id']}/").json()
    assert again["lineage"]["source_commit"] == GIT_COMMIT
    assert again["lineage"]["run_metrics"] == created["lineage"]["run_metrics"]


def test_mlflow_unreachable_is_a_503_naming_mlflow_and_nothing_is_written(
    mlflow_on, adapter, as_token, settings
):
    from tests.support.s3_server import free_port

    settings.MLFLOW_TRACKING_URI = f"http://127.0.0.1:{free_port()}"

    response = as_token.post(
        url(adapter), {"run_id": "a" * 32, "artifact_path": "adapter"}, format="json"
    )

    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "mlflow_unavailable"
    assert "MLflow" in error["message"] and "Nothing was registered" in error["message"]
    assert not AdapterVersion.objects.exists()
    assert staging_is_empty()


def test_without_permission(mlflow_on, tracking, adapter, as_fred, anonymous, tmp_path):
    body = {"run_id": "b" * 32, "artifact_path": "adapter"}

    assert as_fred.post(url(adapter), body, format="json").status_code == 404
    assert anonymous.post(url(adapter), body, format="json").status_code in (401, 403)


def test_with_mlflow_off_it_says_so(settings, adapter, as_token):
    settings.MLFLOW_TRACKING_URI = ""

    response = as_token.post(
        url(adapter), {"run_id": "c" * 32, "artifact_path": "adapter"}, format="json"
    )

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "mlflow_not_configured"
