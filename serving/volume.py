"""The adapter volume that vLLM reads: immutable, versioned folders.

    <root>/<department>/<adapter>/v<N>-<sha8>/

A folder appears only complete (written to a temporary name, every sha256
verified, then renamed), is never rewritten with other bytes, and is deleted
only after a grace period once nothing serves it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from registry.artifact_store import get_artifact_store
from registry.models import AdapterVersion
from serving.models import Deployment, ManifestRender, Rollout, ServedAdapter, StagedFolder
from serving.rules.transitions import ROLLOUT_TERMINAL

CHUNK = 1024 * 1024


class StagingError(Exception):
    pass


def relative_path(version: AdapterVersion) -> str:
    adapter = version.adapter
    return f"{adapter.department.slug}/{adapter.name}/v{version.number}-{version.sha8}"


def serve_path_for(deployment: Deployment, version: AdapterVersion) -> str:
    return f"{deployment.volume_serve_path.rstrip('/')}/{relative_path(version)}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _matches(folder: Path, version: AdapterVersion, progress=None) -> bool:
    expected = {f["path"]: f["sha256"] for f in version.files}
    present = {p.name for p in folder.iterdir()}
    if present != set(expected):
        return False
    for name, digest in expected.items():
        if progress is not None:
            progress()
        if _sha256(folder / name) != digest:
            return False
    return True


def _stat(folder: Path) -> dict[str, list[int]]:
    """Each file's size and mtime: what changes when a file is rewritten, without reading it."""
    found = {}
    for entry in os.scandir(folder):
        info = entry.stat(follow_symlinks=False)
        found[entry.name] = [info.st_size, info.st_mtime_ns]
    return found


def _trusted(row: StagedFolder | None, current: dict, now) -> bool:
    if row is None or row.verified_at is None or row.verified_stat != current:
        return False
    return now - row.verified_at < timedelta(seconds=settings.SERVING_STAGED_REVERIFY_SECONDS)


def stage_version(
    deployment: Deployment, version: AdapterVersion, progress: Callable[[], None] | None = None
) -> StagedFolder:
    """Idempotent: an existing, verified folder is reused as it is. `progress` is
    called between chunks (a rollout renews its claim there: a large artifact
    takes longer to copy than a claim lasts)."""
    staged = stage_versions(deployment, [version], progress)[version.pk]
    if isinstance(staged, StagingError):
        raise staged
    return staged


def stage_versions(
    deployment: Deployment,
    versions: list[AdapterVersion],
    progress: Callable[[], None] | None = None,
) -> dict[int, StagedFolder | StagingError]:
    """stage_version for many versions, by version id: a StagedFolder, or the
    StagingError that version met. One SELECT for every folder's record; a folder
    whose files are as when they were last hashed (the verified marker) is not
    read again, and its record is written only if something about it changed."""
    now = timezone.now()
    rows = {
        row.version_id: row
        for row in StagedFolder.objects.filter(
            deployment=deployment, version_id__in=[v.pk for v in versions]
        )
    }
    result: dict[int, StagedFolder | StagingError] = {}
    for version in versions:
        try:
            row = rows.get(version.pk)
            result[version.pk] = _stage_one(deployment, version, row, now, progress)
        except (StagingError, OSError) as error:
            result[version.pk] = (
                error if isinstance(error, StagingError) else StagingError(str(error))
            )
    return result


def _stage_one(deployment, version, row, now, progress) -> StagedFolder:
    final = Path(deployment.volume_write_path) / relative_path(version)
    serve = serve_path_for(deployment, version)
    if final.is_dir():
        current = _stat(final)
        if _trusted(row, current, now):
            as_recorded = (row.write_path, row.serve_path) == (str(final), serve)
            if as_recorded and row.unreferenced_since is None and row.deleted_at is None:
                return row  # nothing changed: nothing read, nothing written
        elif not _matches(final, version, progress):
            raise StagingError(
                f"{final} exists but does not match version {version.number}'s checksums; "
                "refusing to reuse the path for other bytes."
            )
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.parent / f".staging-{final.name}-{uuid.uuid4().hex[:8]}"
        temporary.mkdir()
        try:
            _download_verified(version, temporary, progress)
            try:
                os.rename(temporary, final)
            except OSError:
                # Another worker finished first; its folder must be the same bytes.
                if not (final.is_dir() and _matches(final, version)):
                    raise
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        current = _stat(final)
    # Hashed just now (or trusted, with a stale record): mark it verified.
    verified_at = row.verified_at if _trusted(row, current, now) else now
    # One INSERT ... ON CONFLICT instead of update_or_create's lock, savepoint and
    # insert (six statements on every rollout's critical path).
    (folder,) = StagedFolder.objects.bulk_create(
        [
            StagedFolder(
                deployment=deployment,
                version=version,
                write_path=str(final),
                serve_path=serve,
                unreferenced_since=None,
                deleted_at=None,
                verified_at=verified_at,
                verified_stat=current,
            )
        ],
        update_conflicts=True,
        unique_fields=["deployment", "version"],
        update_fields=[
            "write_path",
            "serve_path",
            "unreferenced_since",
            "deleted_at",
            "verified_at",
            "verified_stat",
        ],
    )
    return folder


def _download_verified(version: AdapterVersion, into: Path, progress=None) -> None:
    store = get_artifact_store()
    for item in version.files:
        target = into / item["path"]
        digest = hashlib.sha256()
        source_key = f"{version.storage_prefix}/{item['path']}"
        with store.open_read(source_key) as source, target.open("wb") as sink:
            while chunk := source.read(CHUNK):
                if progress is not None:
                    progress()
                digest.update(chunk)
                sink.write(chunk)
            sink.flush()
            os.fsync(sink.fileno())
        if digest.hexdigest() != item["sha256"]:
            raise StagingError(
                f"{item['path']} of version {version.number} does not match its sha256 "
                "in the registry; the stored artifact is corrupt."
            )
        target.chmod(0o444)


def mark_unreferenced(deployment: Deployment) -> None:
    """Starts the grace clock for folders no ServedAdapter points at."""
    served = ServedAdapter.objects.filter(deployment=deployment, version__isnull=False).values(
        "version_id"
    )
    StagedFolder.objects.filter(
        deployment=deployment, deleted_at__isnull=True, unreferenced_since__isnull=True
    ).exclude(version_id__in=served).update(unreferenced_since=timezone.now())


def collect_garbage(now=None) -> list[str]:
    """Deletes folders unreferenced for longer than the grace period, except those
    something may still read: a served adapter, a rollout under way (its target and
    the version it would roll back to), or a KServe manifest someone rendered (the
    latest of each deployment, and any from the last SERVING_MANIFEST_PIN_DAYS)."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.SERVING_STAGED_GRACE_SECONDS)
    deleted = []
    candidates = StagedFolder.objects.filter(
        deleted_at__isnull=True, unreferenced_since__lt=now - grace
    )
    served = set(
        ServedAdapter.objects.filter(version__isnull=False).values_list(
            "deployment_id", "version_id"
        )
    )
    pinned = _pinned(now)
    for folder in candidates:
        key = (folder.deployment_id, folder.version_id)
        if key in served:
            StagedFolder.objects.filter(pk=folder.pk).update(unreferenced_since=None)
            continue
        if key in pinned:  # kept for now; collected once nothing pins it any more
            continue
        shutil.rmtree(folder.write_path, ignore_errors=True)
        StagedFolder.objects.filter(pk=folder.pk).update(deleted_at=now)
        deleted.append(folder.write_path)
    return deleted


def _pinned(now) -> set[tuple[int, int]]:
    """(deployment id, version id) of the folders a rollout under way or a rendered
    manifest may still read, though nothing serves them."""
    named: set[tuple[int, int]] = set()
    for rollout in Rollout.objects.exclude(status__in=ROLLOUT_TERMINAL).values(
        "deployment_id", "target_version_id", "previous_version_id"
    ):
        for version_id in (rollout["target_version_id"], rollout["previous_version_id"]):
            if version_id is not None:
                named.add((rollout["deployment_id"], version_id))
    pinned_since = now - timedelta(days=settings.SERVING_MANIFEST_PIN_DAYS)
    latest = ManifestRender.objects.filter(deployment_id=OuterRef("deployment_id")).order_by(
        "-rendered_at", "-id"
    )
    renders = ManifestRender.objects.filter(
        Q(rendered_at__gte=pinned_since) | Q(pk=Subquery(latest.values("pk")[:1]))
    )
    for deployment_id, version_ids in renders.values_list("deployment_id", "version_ids"):
        named.update((deployment_id, version_id) for version_id in version_ids)
    return named
