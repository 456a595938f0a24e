"""Reading a training run: what the registry keeps of it, as typed values.

Where lineage comes from, in order of preference:
- source commit: the `mlflow.source.git.commit` tag (set by MLflow itself for git
  checkouts), else a `git_commit` / `source_commit` tag;
- dataset: the run's dataset inputs (`mlflow.log_input`), preferring one logged
  with context "train"/"training", else `dataset` / `dataset_digest` tags;
- base model: a param or tag named `base_model_name_or_path`, `base_model` or
  `model_name_or_path` (params first: they are what the training code used).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlflow_bridge.client import mapped
from registry.lineage import run_ui_url

if TYPE_CHECKING:
    from mlflow import MlflowClient

BASE_MODEL_KEYS = ("base_model_name_or_path", "base_model", "model_name_or_path")
COMMIT_TAGS = ("mlflow.source.git.commit", "git_commit", "source_commit")
TRAINING_CONTEXTS = {"train", "training"}
# Tags MLflow writes for its own bookkeeping that a lineage snapshot does not need.
_NOISY_TAGS = {"mlflow.log-model.history", "mlflow.loggedArtifacts"}
_MAX_TAG_VALUE = 5000


@dataclass(frozen=True)
class RunLineage:
    run_id: str
    run_name: str
    status: str
    lifecycle_stage: str
    experiment_id: str
    experiment_name: str
    artifact_uri: str
    source_commit: str = ""
    dataset_name: str = ""
    dataset_digest: str = ""
    base_model: str = ""
    metrics: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)

    @property
    def is_finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def is_deleted(self) -> bool:
        return self.lifecycle_stage == "deleted"

    @property
    def ui_url(self) -> str:
        return run_ui_url(self.experiment_id, self.run_id)


@dataclass(frozen=True)
class ArtifactEntry:
    path: str
    is_dir: bool
    size: int


@mapped
def read_run(client: MlflowClient, run_id: str) -> RunLineage:
    run = client.get_run(run_id)
    experiment = client.get_experiment(run.info.experiment_id)
    tags = dict(run.data.tags)
    params = dict(run.data.params)
    dataset_name, dataset_digest = _dataset(run, tags)
    return RunLineage(
        run_id=run.info.run_id,
        run_name=run.info.run_name or tags.get("mlflow.runName", ""),
        status=run.info.status,
        lifecycle_stage=run.info.lifecycle_stage,
        experiment_id=str(run.info.experiment_id),
        experiment_name=experiment.name if experiment else "",
        artifact_uri=run.info.artifact_uri or "",
        source_commit=_first(tags, COMMIT_TAGS),
        dataset_name=dataset_name,
        dataset_digest=dataset_digest,
        base_model=_first(params, BASE_MODEL_KEYS) or _first(tags, BASE_MODEL_KEYS),
        metrics=dict(run.data.metrics),
        params=params,
        tags={key: value[:_MAX_TAG_VALUE] for key, value in tags.items() if key not in _NOISY_TAGS},
    )


def _first(values: dict, keys) -> str:
    for key in keys:
        if values.get(key):
            return str(values[key])
    return ""


def _dataset(run, tags: dict) -> tuple[str, str]:
    inputs = list(getattr(getattr(run, "inputs", None), "dataset_inputs", None) or [])

    def context(dataset_input) -> str:
        for tag in dataset_input.tags or []:
            if tag.key == "mlflow.data.context":
                return tag.value
        return ""

    inputs.sort(key=lambda item: context(item) not in TRAINING_CONTEXTS)
    if inputs:
        dataset = inputs[0].dataset
        return dataset.name or "", dataset.digest or ""
    return (
        _first(tags, ("dataset", "dataset_name", "dataset.name")),
        _first(tags, ("dataset_digest", "dataset.digest")),
    )


@mapped
def find_artifact(client: MlflowClient, run_id: str, path: str) -> ArtifactEntry | None:
    """The entry at `path` in the run's artifacts, or None. Listing a file or a
    missing path both answer [], so the parent folder is listed instead."""
    path = path.strip("/")
    parent = posixpath.dirname(path)
    for info in client.list_artifacts(run_id, parent or None):
        if info.path.strip("/") == path:
            return ArtifactEntry(info.path, bool(info.is_dir), int(info.file_size or 0))
    return None


@mapped
def walk_artifacts(
    client: MlflowClient, run_id: str, path: str | None = None, *, limit: int = 1000
) -> list[ArtifactEntry]:
    """Files under `path` (all of the run's files when None), at most `limit` entries."""
    found: list[ArtifactEntry] = []
    folders = [path]
    while folders and len(found) < limit:
        folder = folders.pop(0)
        for info in client.list_artifacts(run_id, folder):
            if info.is_dir:
                folders.append(info.path)
            found.append(ArtifactEntry(info.path, bool(info.is_dir), int(info.file_size or 0)))
            if len(found) >= limit:
                break
    return found


@mapped
def download_artifact(client: MlflowClient, run_id: str, path: str, dest: str) -> str:
    return client.download_artifacts(run_id, path, dest)
