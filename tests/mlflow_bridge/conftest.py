"""A real MLflow tracking server for the session, and helpers that log real
training runs to it through the MLflow client (mlflow-skinny, the app's own).

The server comes from .venv-mlflow (scripts/mlflow/install.sh). Without it the
tests skip, unless REQUIRE_MLFLOW is set (CI), where they fail instead.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.factories import make_adapter
from tests.support.adapters import AdapterSpec, adapter_tar_gz
from tests.support.mlflow_server import MlflowServer, mlflow_venv, server_installed

GIT_COMMIT = "3f2c9a1d0b7e4c5a8f6e2d1c0b9a8f7e6d5c4b3a"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    if not server_installed():
        message = (
            f"no MLflow server in {mlflow_venv()}: run `bash scripts/mlflow/install.sh` "
            "(scripts/test.sh does)"
        )
        if os.environ.get("REQUIRE_MLFLOW"):
            pytest.fail(message + "; REQUIRE_MLFLOW is set", pytrace=False)
        pytest.skip(message)
    server = MlflowServer.from_repo(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    print(f"\nmlflow server ready at {server.url} in {server.last_start_seconds:.1f}s")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_on(settings, mlflow_server, s3_store):
    """MLflow on for this test: tasks run eagerly, HTTP failures fail fast, and
    artifacts land in the real S3 store."""
    from config.celery import app

    # Saved before touching Django settings: Celery reads its configuration from
    # them lazily, so saving afterwards would "restore" eager mode for every
    # later test (the browser and vLLM tiers then ran rollouts inside requests).
    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    settings.MLFLOW_TRACKING_URI = mlflow_server.url
    settings.MLFLOW_UI_URL = mlflow_server.url
    settings.MLFLOW_MIRROR_ENABLED = True
    settings.MLFLOW_HTTP_TIMEOUT = 10
    settings.MLFLOW_HTTP_MAX_RETRIES = 0
    settings.MLFLOW_MIRROR_MAX_RETRIES = 2
    settings.MLFLOW_MIRROR_BACKOFF_SECONDS = 0
    settings.CELERY_TASK_ALWAYS_EAGER = True
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    if not mlflow_server.running:  # a failed outage test must not take the rest down
        mlflow_server.start()
    yield mlflow_server
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved


@pytest.fixture
def tracking(mlflow_server):
    """The MLflow client a training pipeline would use."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=mlflow_server.url, registry_uri=mlflow_server.url)


@pytest.fixture
def adapter(lena, legal):
    # The MLflow server outlives each test's database: unique names keep each
    # test's registered model its own.
    return make_adapter(lena, legal, name=f"contracts-{uuid.uuid4().hex[:8]}")


@dataclass
class TrainingRun:
    spec: AdapterSpec = field(default_factory=AdapterSpec)
    artifact_path: str = "adapter"
    base_model: str = "tiny-llama"
    commit: str = GIT_COMMIT
    dataset: tuple[str, str] | None = ("contracts-2026-q3", "a1b2c3d4")
    status: str = "FINISHED"
    as_archive: bool = False
    metrics: dict = field(default_factory=lambda: {"eval_loss": 0.42, "train_loss": 0.31})
    params: dict = field(default_factory=lambda: {"learning_rate": "0.0002", "epochs": "3"})
    files: dict | None = None


def allow_experiment(experiment_id: str, department: str = "legal") -> None:
    """What a platform admin does once per experiment (tests/mlflow_bridge/
    test_experiments.py goes through the API): the department's runs are there."""
    from core.models import Department
    from mlflow_bridge.models import AllowedExperiment

    owner = Department.objects.filter(slug=department).first()
    if owner is not None:
        AllowedExperiment.objects.get_or_create(department=owner, experiment_id=str(experiment_id))


def log_run(client, tmp_path: Path, run: TrainingRun | None = None) -> str:
    """Logs a training run with a real PEFT adapter as its artifact; returns its id."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param

    run = run or TrainingRun()
    experiment = client.get_experiment_by_name("legal-adapters")
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment("legal-adapters")
    )
    allow_experiment(experiment_id)
    tags = {"mlflow.source.git.commit": run.commit} if run.commit else {}
    created = client.create_run(experiment_id, run_name="lora-contracts", tags=tags)
    run_id = created.info.run_id
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(key, value, now, 0) for key, value in run.metrics.items()],
        params=[
            Param(key, value)
            for key, value in {**run.params, "base_model_name_or_path": run.base_model}.items()
        ],
    )
    if run.dataset:
        name, digest = run.dataset
        client.log_inputs(
            run_id,
            datasets=[
                DatasetInput(
                    Dataset(name, digest, "http", '{"url": "https://data.example/contracts"}'),
                    tags=[InputTag("mlflow.data.context", "training")],
                )
            ],
        )
    folder = tmp_path / f"run-{run_id}"
    folder.mkdir()
    files = run.files if run.files is not None else run.spec.files()
    if run.as_archive:
        (folder / "adapter.tar.gz").write_bytes(adapter_tar_gz(run.spec))
        client.log_artifact(run_id, str(folder / "adapter.tar.gz"), run.artifact_path)
    else:
        for name, content in files.items():
            (folder / name).write_bytes(content)
        client.log_artifacts(run_id, str(folder), run.artifact_path)
    if run.status != "RUNNING":
        client.set_terminated(run_id, run.status)
    return run_id
