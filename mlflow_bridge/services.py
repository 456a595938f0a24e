"""MLflow lineage both ways: register a version from a training run, and mirror
adapters, versions, their status and per-deployment aliases into the MLflow
Model Registry.

The mirror never blocks the registry: services only record the desired state
and enqueue a task after commit; tasks push it to MLflow, retrying with backoff,
and the catch-up task and `mlflow_resync` command pick up whatever was missed.
"""

from __future__ import annotations

import contextvars
import logging
import posixpath
import re
import shutil
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.text import slugify

from core.access import require_contributor
from core.actors import Actor
from core.backoff import backoff_delay
from core.claims import Lease
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
    MlflowRejected,
    MlflowUnavailable,
)
from mlflow_bridge.models import MirrorState, MlflowAliasMirror, MlflowVersionMirror
from mlflow_bridge.runs import (
    RunLineage,
    download_artifact,
    find_artifact,
    read_run,
    walk_artifacts,
)
from registry.ingest.sources import MlflowRunArtifact
from registry.models import Adapter, AdapterVersion
from registry.services.versions import Lineage, RegistrationResult, version_register
from registry.sources import require_mlflow_artifact_location
from serving.models import Deployment

logger = logging.getLogger(__name__)

RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# Longer than one push round (a few HTTP calls, each bounded by MLFLOW_HTTP_TIMEOUT);
# renewed every round.
CLAIM_SECONDS = 60
REGISTRY_TAG = "managed_by"
REGISTRY_TAG_VALUE = "lora-adapter-registry"

# ---------------------------------------------------------------------------
# From a run to a version
# ---------------------------------------------------------------------------

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
        with _mlflow_errors(run_id):
            client = mlc.get_client()
            run = read_run(client, run_id)
            _check_run(run)
            require_mlflow_artifact_location(adapter.department, run.artifact_uri, artifact_path)
            source_dir = _download(client, run, artifact_path, workdir)
        token = _run_being_registered.set(run)
        try:
            result = version_register(
                actor=actor,
                adapter=adapter,
                source=MlflowRunArtifact(source_dir),
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


class _mlflow_errors:
    """Maps MLflow failures while reading a run to the registry's HTTP errors."""

    def __init__(self, run_id: str):
        self.run_id = run_id

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
            raise NotFound(f"MLflow has no run {self.run_id!r}.", code="run_not_found") from None
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


def _download(client, run: RunLineage, artifact_path: str, workdir: Path) -> Path:
    """Downloads the artifact into `workdir` after checking that it exists and
    fits the ingest limits, so an oversized run is refused before any byte moves."""
    entry = find_artifact(client, run.run_id, artifact_path)
    if entry is None:
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
        _too_large(f"more than {settings.INGEST_MAX_ENTRIES} files")
    total = sum(e.size for e in files)
    if total > settings.INGEST_MAX_BYTES:
        _too_large(f"{total} bytes, over the limit of {settings.INGEST_MAX_BYTES}")
    dest = workdir / "download"
    dest.mkdir()
    local = Path(download_artifact(client, run.run_id, artifact_path, str(dest)))
    # A single archive file is staged like an uploaded archive: hand over its folder.
    return local if local.is_dir() else local.parent


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


# ---------------------------------------------------------------------------
# From the registry back to MLflow
# ---------------------------------------------------------------------------


def registered_model_name(adapter: Adapter) -> str:
    return f"{adapter.department.slug}.{adapter.name}"


def alias_name(deployment_name: str) -> str:
    """`prod-finance-gpu` for "Prod Finance GPU". MLflow reserves `latest` and `v<N>`."""
    alias = slugify(deployment_name)[:200]
    if not alias:
        raise ValidationFailed(
            f"Deployment name {deployment_name!r} gives no usable MLflow alias.",
            code="bad_alias",
        )
    if alias == "latest" or re.fullmatch(r"v\d+", alias):
        alias = f"deploy-{alias}"
    return alias


def _now():
    return timezone.now()


def _enqueue_on_commit(kind: str, pk: int) -> None:
    def send():
        from mlflow_bridge import tasks

        task = tasks.sync_version_mirror if kind == "version" else tasks.sync_alias_mirror
        try:
            task.delay(pk)
        except Exception:
            # A broker outage must not turn a committed approval into an error;
            # the row stays pending and the catch-up task finds it.
            logger.exception("could not enqueue the MLflow %s mirror of %s", kind, pk)

    transaction.on_commit(send)


def mirror_version_request(version: AdapterVersion) -> MlflowVersionMirror | None:
    """Marks the version's MLflow mirror as pending and syncs it after commit."""
    if not mlc.mirror_enabled():
        return None
    mirror, created = MlflowVersionMirror.objects.get_or_create(version=version)
    if not created:
        MlflowVersionMirror.objects.filter(pk=mirror.pk).update(
            generation=F("generation") + 1,
            state=MirrorState.PENDING,
            attempts=0,
            updated_at=_now(),
        )
    _enqueue_on_commit("version", mirror.pk)
    return mirror


def mirror_alias_set(
    *, deployment: Deployment, adapter: Adapter, version: AdapterVersion
) -> MlflowAliasMirror | None:
    """The deployment's alias must point at `version` (call on promote/rollback)."""
    if version.adapter_id != adapter.pk:
        raise ValidationFailed("The version belongs to another adapter.", code="wrong_adapter")
    return _alias_request(deployment, adapter, version)


def mirror_alias_clear(*, deployment: Deployment, adapter: Adapter) -> MlflowAliasMirror | None:
    """The deployment no longer serves this adapter: its alias must go."""
    return _alias_request(deployment, adapter, None)


def _alias_request(deployment, adapter, version) -> MlflowAliasMirror | None:
    if not mlc.mirror_enabled():
        return None
    alias = alias_name(deployment.name)
    with transaction.atomic():
        row, created = MlflowAliasMirror.objects.select_for_update().get_or_create(
            adapter=adapter,
            alias=alias,
            defaults={"deployment": deployment, "version": version},
        )
        if not created:
            MlflowAliasMirror.objects.filter(pk=row.pk).update(
                deployment=deployment,
                version=version,
                generation=F("generation") + 1,
                state=MirrorState.PENDING,
                attempts=0,
                updated_at=_now(),
            )
            row.refresh_from_db()
        if version is not None:
            # The alias needs the MLflow model version to exist first.
            MlflowVersionMirror.objects.get_or_create(version=version)
        _enqueue_on_commit("alias", row.pk)
    return row


def mirror_version_sync(*, mirror_id: int, force: bool = False) -> str:
    """Pushes one version's current state to MLflow. Returns the row's state, or
    "busy" if another worker holds it. Raises MlflowCallError after recording it."""
    return _sync_claimed(MlflowVersionMirror, mirror_id, _push_version, force)


def mirror_alias_sync(*, alias_id: int, force: bool = False) -> str:
    return _sync_claimed(MlflowAliasMirror, alias_id, _push_alias, force)


def mirror_mark_failed(model, pk: int, error: str) -> None:
    """Retries are exhausted: say so, and leave the row for the catch-up and resync."""
    model.objects.filter(pk=pk).exclude(state=MirrorState.SYNCED).update(
        state=MirrorState.FAILED, last_error=error[:2000], updated_at=_now()
    )


def _sync_claimed(model, pk: int, push, force: bool) -> str:
    lease = Lease(model, "claimed_by", "claimed_until")
    owner = f"mirror-{uuid.uuid4().hex}"
    if not lease.claim(pk, owner, CLAIM_SECONDS):
        # Another worker is pushing this row; it re-reads the generation before
        # it lets go, so a change made meanwhile is not lost.
        return "busy" if model.objects.filter(pk=pk).exists() else "gone"
    try:
        while True:
            # Each push round is a few bounded MLflow calls; renewing per round
            # keeps a short claim held for as long as the work goes on.
            if not lease.renew(pk, owner, CLAIM_SECONDS):
                return "busy"
            row = model.objects.get(pk=pk)
            if (
                not force
                and row.state == MirrorState.SYNCED
                and (row.synced_generation == row.generation)
            ):
                return row.state
            force = False
            generation = row.generation
            model.objects.filter(pk=pk).update(
                attempts=F("attempts") + 1, last_attempt_at=_now(), updated_at=_now()
            )
            try:
                learned = push(row)
            except MlflowCallError as error:
                # Transient: still pending (the task retries). Permanent: failed.
                model.objects.filter(pk=pk).update(
                    state=MirrorState.PENDING if error.transient else MirrorState.FAILED,
                    last_error=error.message[:2000],
                    updated_at=_now(),
                )
                raise
            done = model.objects.filter(pk=pk, generation=generation).update(
                state=MirrorState.SYNCED,
                synced_generation=generation,
                attempts=0,
                last_error="",
                synced_at=_now(),
                updated_at=_now(),
                **learned,
            )
            if done:
                return MirrorState.SYNCED
            # The desired state changed while we pushed: keep what we learned, push again.
            model.objects.filter(pk=pk).update(**learned)
    finally:
        lease.release(pk, owner)


def _version_tags(version: AdapterVersion) -> dict[str, str]:
    tags = {
        "registry_version_id": str(version.pk),
        "registry_version_number": str(version.number),
        "status": version.status,
        "sha256": version.manifest_sha256,
        "registry_artifact_uri": version.artifact_uri,
    }
    if version.reviewed_by_id:
        tags["reviewed_by"] = version.reviewed_by.get_username()
    return tags


def _source_of(version: AdapterVersion) -> tuple[str, str | None]:
    if version.mlflow_run_uri.startswith("runs:/") and version.mlflow_artifact_path:
        return version.mlflow_run_uri, version.mlflow_run_id
    if version.artifact_uri.startswith("file:"):
        # MLflow refuses local paths as a source unless they sit inside a run's
        # artifacts; a registry-local store is named by a non-local URI instead.
        adapter = version.adapter
        return f"registry:/{adapter.department.slug}/{adapter.name}/{version.number}", None
    return version.artifact_uri, None


def _ensure_registered_model(client, adapter: Adapter) -> str:
    name = registered_model_name(adapter)
    tags = {
        "department": adapter.department.slug,
        "registry_adapter_id": str(adapter.pk),
        "served_name": adapter.served_name,
        "base_model": adapter.base_model,
        REGISTRY_TAG: REGISTRY_TAG_VALUE,
    }
    try:
        model = client.get_registered_model(name)
    except Exception as error:
        if not isinstance(mlc.translate(error), MlflowNotFound):
            raise
        try:
            client.create_registered_model(name, tags=tags, description=adapter.description)
        except Exception as create_error:
            # Lost a race with another worker: the model now exists, which is the goal.
            if getattr(create_error, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise
        return name
    owner = model.tags.get("registry_adapter_id")
    if owner and owner != str(adapter.pk):
        raise MlflowRejected(
            f"MLflow registered model {name!r} belongs to registry adapter {owner}, "
            f"not {adapter.pk}."
        )
    for key, value in tags.items():
        if model.tags.get(key) != value:
            client.set_registered_model_tag(name, key, value)
    return name


def _find_model_version(client, name: str, known: str, version_id: int):
    if known:
        try:
            found = client.get_model_version(name, known)
            if found.tags.get("registry_version_id") == str(version_id):
                return found
        except Exception as error:
            if not isinstance(mlc.translate(error), MlflowNotFound):
                raise
    # Found by tag, so a crash between creating it and recording its number
    # never leads to a second MLflow version for the same registry version.
    token = None
    while True:
        page = client.search_model_versions(f"name='{name}'", max_results=200, page_token=token)
        for found in page:
            if found.tags.get("registry_version_id") == str(version_id):
                return found
        token = page.token
        if not token:
            return None


@mlc.mapped
def _push_version(row: MlflowVersionMirror) -> dict:
    version = AdapterVersion.objects.select_related("adapter__department", "reviewed_by").get(
        pk=row.version_id
    )
    client = mlc.get_client()
    name = _ensure_registered_model(client, version.adapter)
    tags = _version_tags(version)
    found = _find_model_version(client, name, row.model_version, version.pk)
    if found is None:
        source, run_id = _source_of(version)
        found = client.create_model_version(
            name=name,
            source=source,
            run_id=run_id,
            tags=tags,
            description=f"Registry version {version.number} of {version.adapter}.",
            await_creation_for=0,
        )
    else:
        for key, value in tags.items():
            if found.tags.get(key) != value:
                client.set_model_version_tag(name, found.version, key, value)
    return {
        "registered_model": name,
        "model_version": str(found.version),
        "synced_status": version.status,
    }


@mlc.mapped
def _push_alias(row: MlflowAliasMirror) -> dict:
    adapter = Adapter.objects.select_related("department").get(pk=row.adapter_id)
    client = mlc.get_client()
    name = registered_model_name(adapter)
    if row.version_id is None:
        try:
            client.delete_registered_model_alias(name, row.alias)
        except Exception as error:
            if not isinstance(mlc.translate(error), MlflowNotFound):
                raise
        return {}
    version_mirror, _ = MlflowVersionMirror.objects.get_or_create(version_id=row.version_id)
    state = mirror_version_sync(mirror_id=version_mirror.pk)
    if state != MirrorState.SYNCED:
        raise MlflowUnavailable(f"the version's own mirror is {state}; the alias waits for it")
    version_mirror.refresh_from_db()
    client.set_registered_model_alias(name, row.alias, version_mirror.model_version)
    return {}


# ---------------------------------------------------------------------------
# Catching up
# ---------------------------------------------------------------------------


def _due(model, now):
    """Pending or failed rows nobody holds, whose backoff (by attempts) has passed."""
    free = Lease(model, "claimed_by", "claimed_until").free(now)
    rows = model.objects.filter(state__in=[MirrorState.PENDING, MirrorState.FAILED]).filter(free)
    base = settings.MLFLOW_MIRROR_BACKOFF_SECONDS
    cap = settings.MLFLOW_MIRROR_BACKOFF_MAX_SECONDS
    due = []
    for pk, attempts, last in rows.values_list("pk", "attempts", "last_attempt_at"):
        wait = backoff_delay(attempts, base=base, cap=cap)
        if last is None or last <= now - timedelta(seconds=wait):
            due.append(pk)
    return due


def mirror_catch_up() -> dict[str, int]:
    """Enqueues every pending or failed mirror row whose backoff has passed."""
    if not mlc.mirror_enabled():
        return {"versions": 0, "aliases": 0}
    now = _now()
    versions = _due(MlflowVersionMirror, now)
    aliases = _due(MlflowAliasMirror, now)
    from mlflow_bridge import tasks

    for pk in versions:
        tasks.sync_version_mirror.delay(pk)
    for pk in aliases:
        tasks.sync_alias_mirror.delay(pk)
    return {"versions": len(versions), "aliases": len(aliases)}


def mirror_resync(*, only_unsynced: bool = False, log=None) -> dict[str, int]:
    """Pushes every version and alias to MLflow now, in this process. Idempotent:
    existing MLflow versions are found by their registry tag, never duplicated."""
    if not mlc.mirror_enabled():
        raise DependencyUnavailable(
            "The MLflow mirror is off (MLFLOW_TRACKING_URI is empty or "
            "MLFLOW_MIRROR_ENABLED is false).",
            code="mlflow_not_configured",
        )
    missing = AdapterVersion.objects.filter(mlflow_mirror__isnull=True)
    MlflowVersionMirror.objects.bulk_create(
        [MlflowVersionMirror(version_id=pk) for pk in missing.values_list("pk", flat=True)],
        ignore_conflicts=True,
    )
    counts = {"synced": 0, "failed": 0, "busy": 0}
    jobs = [
        (MlflowVersionMirror, "version", mirror_version_sync, "mirror_id"),
        (MlflowAliasMirror, "alias", mirror_alias_sync, "alias_id"),
    ]
    for model, label, sync, argument in jobs:
        rows = model.objects.order_by("pk")
        if only_unsynced:
            rows = rows.exclude(state=MirrorState.SYNCED)
        for pk in rows.values_list("pk", flat=True):
            try:
                state = sync(**{argument: pk, "force": not only_unsynced})
            except MlflowCallError as error:
                counts["failed"] += 1
                if not error.transient:
                    mirror_mark_failed(model, pk, error.message)
                if log:
                    log(f"{label} mirror {pk}: failed: {error.message}")
                continue
            key = "synced" if state == MirrorState.SYNCED else "busy"
            counts[key] += 1
    return counts


# ---------------------------------------------------------------------------
# Reading the mirror (API, admin, health)
# ---------------------------------------------------------------------------


def version_mirror_summary(version: AdapterVersion) -> dict:
    if not mlc.mirror_enabled():
        return {"enabled": False}
    try:
        row = version.mlflow_mirror
    except MlflowVersionMirror.DoesNotExist:
        return {"enabled": True, "state": None}
    return {
        "enabled": True,
        "state": row.state,
        "registered_model": row.registered_model,
        "model_version": row.model_version or None,
        "status_in_mlflow": row.synced_status or None,
        "url": mlc.model_version_ui_url(row.registered_model, row.model_version) or None,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "updated_at": row.updated_at,
        "synced_at": row.synced_at,
    }


def alias_mirror_summary(row: MlflowAliasMirror) -> dict:
    return {
        "deployment_name": row.deployment.name,
        "alias": row.alias,
        "version": row.version_id,
        "state": row.state,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "updated_at": row.updated_at,
        "synced_at": row.synced_at,
    }


def mlflow_health() -> dict:
    if not mlc.is_enabled():
        return {
            "ok": True,
            "optional": True,
            "mirror": "off",
            "detail": "MLFLOW_TRACKING_URI is empty: registration from runs and the mirror "
            "are off.",
        }
    import requests

    result = {"optional": True, "mirror": "on" if mlc.mirror_enabled() else "off"}
    try:
        response = requests.get(settings.MLFLOW_TRACKING_URI + "/health", timeout=2)
        result["ok"] = response.status_code == 200
    except requests.RequestException as error:
        result["ok"] = False
        result["error"] = f"MLflow unreachable: {type(error).__name__}"
    result["pending"] = MlflowVersionMirror.objects.exclude(state=MirrorState.SYNCED).count()
    result["pending_aliases"] = MlflowAliasMirror.objects.exclude(state=MirrorState.SYNCED).count()
    return result
