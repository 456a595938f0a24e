"""The registry mirrored into the MLflow Model Registry: adapters, versions,
their status and per-deployment aliases.

An outbox: the mirror never blocks the registry. Services only record the
desired state (a row per version or alias, its generation bumped) and enqueue a
task after commit; tasks push it to MLflow, retrying with backoff, and the
catch-up task and `mlflow_resync` command pick up whatever was missed.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.text import slugify

from core.backoff import backoff_delay
from core.claims import Lease
from core.errors import (
    DependencyUnavailable,
    ValidationFailed,
)
from mlflow_bridge import client as mlc
from mlflow_bridge.client import (
    MlflowCallError,
    MlflowNotFound,
    MlflowRejected,
    MlflowUnavailable,
)
from mlflow_bridge.models import MirrorState, MlflowAliasMirror, MlflowVersionMirror
from mlflow_bridge.signals import mirror_pending
from registry.models import Adapter, AdapterVersion
from serving.models import Deployment

logger = logging.getLogger(__name__)

# Longer than one push round (a few HTTP calls, each bounded by MLFLOW_HTTP_TIMEOUT);
# renewed every round.
CLAIM_SECONDS = 60
REGISTRY_TAG = "managed_by"
REGISTRY_TAG_VALUE = "lora-adapter-registry"


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
    # The receiver (mlflow_bridge.receivers.send_mirror) sends the task.
    transaction.on_commit(lambda: mirror_pending.send(sender=None, kind=kind, pk=pk))


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
        row, created = MlflowAliasMirror.objects.select_for_update(no_key=True).get_or_create(
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
    if version.reviewed_by is not None:
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


def mirror_due() -> tuple[list[int], list[int]]:
    """The pending or failed mirror rows whose backoff has passed (version rows,
    alias rows): the catch-up task sends them again."""
    if not mlc.mirror_enabled():
        return [], []
    now = _now()
    return list(_due(MlflowVersionMirror, now)), list(_due(MlflowAliasMirror, now))


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
    jobs: list[tuple[type[MlflowVersionMirror | MlflowAliasMirror], str, Callable[..., str], str]]
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

    result: dict[str, bool | str | int] = {
        "optional": True,
        "mirror": "on" if mlc.mirror_enabled() else "off",
    }
    try:
        response = requests.get(settings.MLFLOW_TRACKING_URI + "/health", timeout=2)
        result["ok"] = response.status_code == 200
    except requests.RequestException as error:
        result["ok"] = False
        result["error"] = f"MLflow unreachable: {type(error).__name__}"
    result["pending"] = MlflowVersionMirror.objects.exclude(state=MirrorState.SYNCED).count()
    result["pending_aliases"] = MlflowAliasMirror.objects.exclude(state=MirrorState.SYNCED).count()
    return result
