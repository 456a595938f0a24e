"""A run's artifact location decides whether the registry may read it at all
(registry.source_policy): against the real MLflow server, with the real S3 (moto)
store behind the registry. Each refusal is a 4xx naming the rule, and nothing
is stored."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from registry.models import AdapterVersion
from tests.mlflow_bridge.conftest import allow_experiment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.mlflow


def run_at(tracking, artifact_location: str, tmp_path: Path, *, log_files: bool) -> str:
    """A FINISHED run in an experiment whose artifacts live at `artifact_location`."""
    experiment_id = tracking.create_experiment(
        f"located-{uuid.uuid4().hex[:8]}", artifact_location=artifact_location
    )
    allow_experiment(experiment_id)
    run_id = tracking.create_run(experiment_id).info.run_id
    if log_files:
        folder = tmp_path / f"files-{run_id}"
        folder.mkdir()
        for name, data in AdapterSpec(seed=41).files().items():
            (folder / name).write_bytes(data)
        tracking.log_artifacts(run_id, str(folder), "adapter")
    tracking.set_terminated(run_id, "FINISHED")
    return run_id


def register(client, adapter, run_id):
    return client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/from-mlflow-run/",
        {"run_id": run_id, "artifact_path": "adapter"},
        format="json",
    )


def assert_nothing_stored(store):
    assert not AdapterVersion.objects.exists()
    assert store.list_prefix("adapters/") == []


def test_a_file_location_outside_the_roots_is_refused(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store, settings
):
    settings.MLFLOW_FILE_ARTIFACT_ROOTS = [str(tmp_path / "allowed")]
    run_id = run_at(tracking, (tmp_path / "host-disk").as_uri(), tmp_path, log_files=True)

    response = register(as_token, adapter, run_id)

    assert response.status_code == 403, response.json()
    error = response.json()["error"]
    assert error["code"] == "mlflow_artifact_location_not_allowed"
    assert "MLFLOW_FILE_ARTIFACT_ROOTS" in error["message"]
    assert_nothing_stored(s3_store)


def test_a_file_location_under_a_root_is_read(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store, settings
):
    settings.MLFLOW_FILE_ARTIFACT_ROOTS = [str(tmp_path / "allowed")]
    run_id = run_at(tracking, (tmp_path / "allowed" / "mlruns").as_uri(), tmp_path, log_files=True)
    response = register(as_token, adapter, run_id)
    assert response.status_code == 201, response.json()


def test_an_s3_location_outside_the_departments_prefixes_is_refused(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store
):
    # Another department's training output; the registry would read it with its own keys.
    run_id = run_at(tracking, "s3://training-out/finance/mlruns", tmp_path, log_files=False)

    response = register(as_token, adapter, run_id)

    assert response.status_code == 403, response.json()
    error = response.json()["error"]
    assert error["code"] == "source_not_allowed"
    assert "s3://training-out/finance/mlruns" in error["message"]
    assert_nothing_stored(s3_store)


def test_an_s3_location_in_the_registry_store_is_refused(
    mlflow_on, tracking, adapter, as_token, tmp_path, s3_store
):
    run_id = run_at(tracking, f"s3://{s3_store.bucket}/registry/mlruns", tmp_path, log_files=False)
    response = register(as_token, adapter, run_id)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "source_is_registry_store"
    assert_nothing_stored(s3_store)


def test_other_schemes_are_refused(mlflow_on, tracking, adapter, as_token, tmp_path, s3_store):
    run_id = run_at(tracking, "gs://bucket/mlruns", tmp_path, log_files=False)
    response = register(as_token, adapter, run_id)
    assert response.status_code == 403, response.json()
    assert response.json()["error"]["code"] == "mlflow_artifact_location_not_allowed"
    assert_nothing_stored(s3_store)


def test_http_locations_are_read_only_from_the_tracking_server(settings, legal):
    # The real server refuses to create http(s) artifact locations unless told to
    # (MLFLOW_ALLOWED_HOST_ADDRESSED_ARTIFACT_SCHEMES), so this rule is checked directly.
    from core.errors import NotAuthorized
    from registry.source_policy import require_mlflow_artifact_location

    settings.MLFLOW_TRACKING_URI = "https://mlflow.internal:5000"
    require_mlflow_artifact_location(legal, "https://mlflow.internal:5000/api/x/1", "adapter")
    for elsewhere in ("http://169.254.169.254/latest", "https://mlflow.internal:6000/x"):
        with pytest.raises(NotAuthorized, match="tracking server"):
            require_mlflow_artifact_location(legal, elsewhere, "adapter")


def test_an_s3_run_is_read_with_the_allowed_sources_own_endpoint_and_keys(
    mlflow_on,
    tracking,
    adapter,
    as_token,
    tmp_path,
    s3_store,
    s3_endpoint,
    root,
    legal,
    monkeypatch,
):
    """Issue 21, item 1: MLflow's own client read `s3:` run artifacts with the
    process's ambient AWS settings; the registry reads them like an `s3_uri`
    registration, with the department's artifact source (endpoint, keys)."""
    from registry.services.artifact_sources import artifact_source_create
    from tests.conftest import actor
    from tests.support.s3_server import make_bucket, s3_client

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)  # nothing ambient to fall back on
    bucket = f"training-{uuid.uuid4().hex[:10]}"
    make_bucket(s3_endpoint, bucket)
    artifact_source_create(
        actor=actor(root),
        department=legal,
        uri_prefix=f"s3://{bucket}/legal",
        endpoint_url=s3_endpoint,
        region="us-east-1",
        access_key_id="source-key",
        secret_access_key="source-secret",
    )
    run_id = run_at(tracking, f"s3://{bucket}/legal/mlruns", tmp_path, log_files=False)
    # The training job wrote its adapter to S3 itself, where the run points.
    where = tracking.get_run(run_id).info.artifact_uri.removeprefix(f"s3://{bucket}/")
    client = s3_client(s3_endpoint)
    for name, data in AdapterSpec(seed=42).files().items():
        client.put_object(Bucket=bucket, Key=f"{where}/adapter/{name}", Body=data)

    response = register(as_token, adapter, run_id)

    assert response.status_code == 201, response.json()
    version = AdapterVersion.objects.get()
    assert version.mlflow_run_id == run_id
