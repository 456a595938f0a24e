"""MLflow lineage into the registry: register a version from a training run
(its artifact ingested through the normal path, version_register) and complete
the version's lineage from the run inside the registration transaction.

The other direction, the registry mirrored into MLflow, is mlflow_bridge/mirror.py.
"""

from __future__ import annotations

import contextvars
import logging
import posixpath
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote, urlsplit

from django.conf import settings

from core.access import require_contributor
from core.actors import Actor
from core.errors import (
    Conflict,
    DependencyUnavailable,
    NotFound,
    ValidationFailed,
)
from core.models import Ability
from mlflow_bridge import client as mlc
from mlflow_bridge.client import (
    MlflowCallError,
    MlflowNotFound,
    MlflowUnavailable,
)
from mlflow_bridge.experiments import experiment_allowed
from mlflow_bridge.runs import (
    RunLineage,
    download_artifact,
    find_artifact,
    read_run,
    walk_artifacts,
)
from registry.ingest.incoming import MlflowRunArtifact, S3Prefix
from registry.models import Adapter, AdapterVersion
from registry.services.versions import Lineage, RegistrationResult, version_register
from registry.source_policy import require_mlflow_artifact_location

logger = logging.getLogger(__name__)

RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

# The run being registered in this context. version_register knows only the
# basic lineage fields; the after_version_registered hook writes the rest
# (snapshot, warnings) in the same transaction as the new row.
_run_being_registered: contextvars.ContextVar[RunLineage | None] = contextvars.ContextVar(
    "run_being_registered", default=None
)


def register_from_run(
    *, actor: Actor, adapter: Adapter, run_id: str, artifact_path: str
) -> RegistrationResult:
    """Registers the adapter that run `run_id` logged under `artifact_path`.

    The same run registered again returns the existing version without asking
    MLflow, so a pipeline's retry succeeds even while MLflow is down.
    """
    require_contributor(actor, adapter.department_id, Ability.REGISTER_VERSIONS, "Adapter")
    if not re.match(RUN_ID_PATTERN, run_id or ""):
        raise ValidationFailed("run_id must be an MLflow run id.", code="bad_run_id")
    artifact_path = _clean_artifact_path(artifact_path)
    existing = adapter.versions.filter(mlflow_run_id=run_id).first()
    if existing:
        if existing.mlflow_artifact_path and existing.mlflow_artifact_path != artifact_path:
            raise Conflict(
                f"Run {run_id} is already registered as version {existing.number} "
                f"from artifact path {existing.mlflow_artifact_path!r}.",
                code="run_already_registered",
                details={
                    "version": existing.number,
                    "artifact_path": existing.mlflow_artifact_path,
                },
            )
        return RegistrationResult(version=existing, created=False)
    if not mlc.is_enabled():
        # Not an outage (503, retry later) but a registry without the feature:
        # the operation is not there, as its schema says (404).
        raise NotFound(
            "MLflow is not configured on this registry (MLFLOW_TRACKING_URI is empty).",
            code="mlflow_not_configured",
        )

    staging_root = Path(settings.INGEST_STAGING_DIR)
    staging_root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="mlflow-", dir=staging_root))
    try:
        with _mlflow_errors(run_id, adapter.department):
            client = mlc.get_client()
            run = read_run(client, run_id)
            # Before anything about the run is used or shown: another
            # department's run is, to this one, a run that does not exist.
            if not experiment_allowed(adapter.department, run.experiment_id):
                raise NotFound(_no_such_run(run_id, adapter.department), code="run_not_found")
            _check_run(run)
            require_mlflow_artifact_location(adapter.department, run.artifact_uri, artifact_path)
            source = _artifact_source(client, run, artifact_path, workdir)
        token = _run_being_registered.set(run)
        try:
            result = version_register(
                actor=actor,
                adapter=adapter,
                source=source,
                lineage=Lineage(
                    mlflow_run_id=run.run_id,
                    mlflow_run_uri=f"runs:/{run.run_id}/{artifact_path}",
                    source_commit=run.source_commit[:100],
                    dataset=run.dataset_name[:300],
                ),
            )
        finally:
            _run_being_registered.reset(token)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.created:
        result.warnings.extend(result.version.lineage_warnings)
    return result


def _clean_artifact_path(path: str) -> str:
    cleaned = (path or "").strip().strip("/")
    parts = cleaned.split("/")
    if not cleaned or any(part in ("", ".", "..") for part in parts) or "\\" in cleaned:
        raise ValidationFailed(
            "artifact_path must be a relative path inside the run, like 'adapter'.",
            code="bad_artifact_path",
        )
    return posixpath.normpath(cleaned)


def _no_such_run(run_id: str, department) -> str:
    return (
        f"MLflow has no run {run_id!r} in an experiment {department.name} may register "
        "from (a platform admin allows experiments per department)."
    )


class _mlflow_errors:
    """Maps MLflow failures while reading a run to the registry's HTTP errors."""

    def __init__(self, run_id: str, department):
        self.run_id = run_id
        self.department = department

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if not isinstance(error, MlflowCallError):
            return False
        if isinstance(error, MlflowUnavailable):
            raise DependencyUnavailable(
                f"{error.message}. Nothing was registered; try again when MLflow is back.",
                code="mlflow_unavailable",
            ) from None
        if isinstance(error, MlflowNotFound) or error.error_code == "INVALID_PARAMETER_VALUE":
            raise NotFound(
                _no_such_run(self.run_id, self.department), code="run_not_found"
            ) from None
        raise DependencyUnavailable(
            f"MLflow refused the request: {error.message}", code="mlflow_error"
        ) from None


def _check_run(run: RunLineage) -> None:
    if run.is_deleted:
        raise NotFound(f"MLflow run {run.run_id} is deleted.", code="run_not_found")
    if not run.is_finished:
        raise Conflict(
            f"MLflow run {run.run_id} is {run.status}; only FINISHED runs can be registered.",
            code="run_not_finished",
            details={"run_status": run.status},
        )


def _artifact_source(client, run: RunLineage, artifact_path: str, workdir: Path):
    """What version_register stages: the run's artifact, read without following
    the run to any place the registry does not allow.

    - `s3:` runs are read like an `s3_uri` registration (S3Prefix): with the
      allowed source's own endpoint and keys, never the registry's ambient AWS
      credentials, under the ingest limits.
    - `mlflow-artifacts:` and http(s) runs are fetched from the configured
      tracking server only, streamed with a byte cap (MLflow's own client would
      follow the run's artifact URI and trust the listing's sizes).
    - `file:` runs (under MLFLOW_FILE_ARTIFACT_ROOTS) are copied by MLflow's client.
    """
    scheme = urlsplit(run.artifact_uri).scheme.lower()
    if scheme == "s3":
        return S3Prefix(run.artifact_uri.rstrip("/") + "/" + artifact_path)
    files = _planned_files(client, run, artifact_path)
    dest = workdir / "download"
    dest.mkdir()
    if scheme in ("mlflow-artifacts", "http", "https"):
        _download_through_tracking_server(run, artifact_path, files, dest)
        return MlflowRunArtifact(dest)
    local = Path(download_artifact(client, run.run_id, artifact_path, str(dest)))
    # A single archive file is staged like an uploaded archive: hand over its folder.
    return MlflowRunArtifact(local if local.is_dir() else local.parent)


def _planned_files(client, run: RunLineage, artifact_path: str) -> list:
    """The files under `artifact_path`, checked against the ingest limits before
    any byte moves (the streaming cap below still counts what really arrives)."""
    entry = find_artifact(client, run.run_id, artifact_path)
    if entry is None:
        # The run is the caller's department's (checked before): its tree may be shown.
        contents = [
            e.path + ("/" if e.is_dir else "") for e in walk_artifacts(client, run.run_id, limit=50)
        ]
        listing = ", ".join(contents) if contents else "no artifacts at all"
        raise ValidationFailed(
            f"Run {run.run_id} has no artifact at {artifact_path!r}. It contains: {listing}.",
            code="artifact_path_not_found",
            details={"run_contents": contents},
        )
    if entry.is_dir:
        limit = settings.INGEST_MAX_ENTRIES
        files = [e for e in walk_artifacts(client, run.run_id, artifact_path, limit=limit + 1)]
        files = [e for e in files if not e.is_dir]
    else:
        files = [entry]
    if len(files) > settings.INGEST_MAX_ENTRIES:
        _too_large(f"more than {settings.INGEST_MAX_ENTRIES} files (INGEST_MAX_ENTRIES)")
    total = sum(e.size for e in files)
    if total > settings.INGEST_MAX_BYTES:
        _too_large(
            f"{total} bytes, over the limit of {settings.INGEST_MAX_BYTES} (INGEST_MAX_BYTES)"
        )
    return files


def _artifact_url(run: RunLineage, relative: str) -> str:
    """The URL of one artifact file on the configured tracking server."""
    tracking = settings.MLFLOW_TRACKING_URI.rstrip("/")
    parts = urlsplit(run.artifact_uri)
    if parts.scheme == "mlflow-artifacts":
        root = parts.path.strip("/")
        return f"{tracking}/api/2.0/mlflow-artifacts/artifacts/{quote(root)}/{quote(relative)}"
    # http(s) on the tracking server itself (require_mlflow_artifact_location checked it).
    return f"{run.artifact_uri.rstrip('/')}/{quote(relative)}"


def _download_through_tracking_server(run, artifact_path: str, files, dest: Path) -> None:
    import requests

    headers = {}
    if settings.MLFLOW_TRACKING_TOKEN:
        headers["Authorization"] = f"Bearer {settings.MLFLOW_TRACKING_TOKEN}"
    single = len(files) == 1 and files[0].path.strip("/") == artifact_path
    budget = settings.INGEST_MAX_BYTES
    with requests.Session() as http:
        http.trust_env = False  # the tracking server's own address, never a proxy's
        for entry in files:
            relative = entry.path.strip("/")
            inside = posixpath.basename(relative) if single else relative[len(artifact_path) + 1 :]
            target = _safe_target(dest, inside)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                # No redirects: a redirect could send the token anywhere.
                with http.get(
                    _artifact_url(run, relative),
                    headers=headers,
                    stream=True,
                    allow_redirects=False,
                    timeout=(5, settings.MLFLOW_HTTP_TIMEOUT),
                ) as response:
                    if response.status_code != 200:
                        raise DependencyUnavailable(
                            f"MLflow answered {response.status_code} for the run's artifact "
                            f"{relative!r}; nothing was registered.",
                            code="mlflow_error",
                        )
                    with target.open("wb") as out:
                        for chunk in response.iter_content(1024 * 1024):
                            budget -= len(chunk)
                            if budget < 0:
                                _too_large(
                                    f"more than {settings.INGEST_MAX_BYTES} bytes arrived "
                                    "(INGEST_MAX_BYTES), more than the listing said"
                                )
                            out.write(chunk)
            except requests.RequestException as error:
                raise DependencyUnavailable(
                    f"MLflow is unreachable while downloading the run's artifact "
                    f"({type(error).__name__}); nothing was registered.",
                    code="mlflow_unavailable",
                ) from None


def _safe_target(dest: Path, relative: str) -> Path:
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        raise ValidationFailed(
            f"The run lists an artifact named {relative!r}, which is not a safe relative path.",
            code="bad_artifact_path",
        )
    return dest.joinpath(*parts)


def _too_large(what: str) -> None:
    error = ValidationFailed(f"The run's artifact is too large: {what}.", code="artifact_too_large")
    error.status = 413
    raise error


def record_run_lineage(version: AdapterVersion) -> None:
    """after_version_registered hook: completes the lineage of a version being
    registered from a run, inside the registration transaction."""
    run = _run_being_registered.get()
    if run is None or run.run_id != version.mlflow_run_id:
        return
    fields = {
        "mlflow_experiment_id": run.experiment_id[:64],
        "mlflow_experiment_name": run.experiment_name[:500],
        "mlflow_artifact_path": version.mlflow_run_uri.split("/", 2)[-1][:500]
        if version.mlflow_run_uri.startswith("runs:/")
        else "",
        "dataset_digest": run.dataset_digest[:100],
        "run_base_model": run.base_model[:300],
        "run_metrics": run.metrics,
        "run_params": run.params,
        "run_tags": run.tags,
        "lineage_warnings": _lineage_warnings(run, version),
    }
    AdapterVersion.objects.filter(pk=version.pk).update(**fields)
    for name, value in fields.items():
        setattr(version, name, value)


def _lineage_warnings(run: RunLineage, version: AdapterVersion) -> list[str]:
    warnings = []
    stated = version.base_model_name_or_path or version.adapter.base_model
    if run.base_model and stated and run.base_model != stated:
        warnings.append(
            f"The run says its base model is {run.base_model!r}, but the adapter's "
            f"base_model_name_or_path is {stated!r}."
        )
    if not run.source_commit:
        warnings.append("The run records no source commit (mlflow.source.git.commit).")
    return warnings
