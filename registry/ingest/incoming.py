"""Where a new version's files come from: one `IncomingArtifact` per way in.

`version_register` takes exactly one source. A source stages its files into a
folder under the registration's work directory, with the same name rules and
limits whichever way the bytes came, and says whether its files are already
in the store (a streamed upload) or must be stored after validation.

    UploadedFiles    files or one archive the request carried (Django's UploadedFile)
    StreamedArtifact a streamed upload, already in the store (registry.ingest.streamed)
    S3Prefix         a user-given s3:// object or folder, downloaded within the limits
    MlflowRunArtifact the folder an MLflow run's artifact was downloaded to
    LocalFolder      a local folder

Importable without Django (the storage tests run with `-p no:django`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from core.errors import DependencyUnavailable, ValidationFailed
from registry.storage import COPY_BUFFER, StorageError, make_s3_client, parse_s3_uri, validate_key
from registry.storage.s3 import DENIED_CODES, NOT_FOUND_CODES, error_code, is_boto_error

from .errors import ArtifactRejected, SourceRejected
from .staging import IngestLimits, StagedArtifact, UploadSource, stage_directory, stage_upload

__all__ = [
    "IncomingArtifact",
    "LocalFolder",
    "MlflowRunArtifact",
    "S3Prefix",
    "SourceRejected",
    "UploadedFiles",
    "download_s3_prefix",
]


class IncomingArtifact(Protocol):
    """A new version's files on their way in (not registry.models.ArtifactSource,
    the S3 prefix a department may register from)."""

    # Recorded on the version as where it came from ("" for uploads).
    source_uri: str

    @property
    def stored_prefix(self) -> str | None:
        """The store prefix the files already sit under, or None: store them after staging."""

    def stage(self, workdir: Path, limits: IngestLimits) -> StagedArtifact:
        """Stage into a new folder under `workdir` (removed by the caller).
        Raises ArtifactRejected, or an ApplicationError for a source's own failures."""

    def discard(self) -> None:
        """No version keeps these files: delete whatever the source stored. Safe to repeat."""

    def close(self) -> None:
        """Release local resources; called once registration is over, whatever happened."""


class _Staged:
    """The common case: nothing stored before validation, nothing to release."""

    source_uri = ""
    stored_prefix: str | None = None

    def discard(self) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def _dest(workdir: Path) -> Path:
        dest = workdir / "artifact"
        dest.mkdir()
        return dest


class UploadedFiles(_Staged):
    """One archive or the loose adapter files, as the request delivered them."""

    def __init__(self, uploads: Sequence[UploadSource]):
        self.uploads = list(uploads)

    def stage(self, workdir: Path, limits: IngestLimits) -> StagedArtifact:
        if not self.uploads:
            raise ArtifactRejected("empty_upload", "No files were uploaded.")
        return stage_upload(self.uploads, self._dest(workdir), limits)


class LocalFolder(_Staged):
    """A folder on this machine. A folder holding one archive is taken as that
    archive, as if it had been uploaded."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def stage(self, workdir: Path, limits: IngestLimits) -> StagedArtifact:
        return _stage_folder(self.path, self._dest(workdir), limits)


class MlflowRunArtifact(LocalFolder):
    """The folder an MLflow run's artifact was downloaded to. The download, and
    how MLflow's failures are answered, stay in the MLflow app: registry may not
    import it. Its lineage travels in version_register's `lineage`."""


class S3Prefix(_Staged):
    """A user-given `s3://bucket/key` (one object) or `s3://bucket/folder/`.

    `client_options` are make_s3_client's: the allowed source's endpoint and
    credentials (registry.source_policy.s3_options_for), which version_register
    sets once the location has been checked against the department's sources.
    """

    def __init__(self, uri: str, client_options: dict[str, Any] | None = None):
        self.uri = uri
        self.source_uri = uri
        self.client_options = client_options

    def stage(self, workdir: Path, limits: IngestLimits) -> StagedArtifact:
        options = self.client_options
        if options is None:
            # Never read with the server's own credentials by default: only a
            # location checked against the department's allowed sources is read.
            raise RuntimeError(f"{self.uri}: no allowed source's client options were set.")
        download = workdir / "download"
        download.mkdir()
        self._download(download, limits, options)
        return _stage_folder(download, self._dest(workdir), limits)

    def _download(self, dest: Path, limits: IngestLimits, client_options: dict[str, Any]) -> None:
        options = dict(client_options)
        options.pop("multipart_chunk_mb", None)
        options.pop("max_concurrency", None)
        try:
            download_s3_prefix(
                self.uri,
                dest,
                max_files=limits.max_entries,
                max_total_bytes=limits.max_total_bytes,
                **options,
            )
        except SourceRejected as error:
            raise ValidationFailed(str(error), code="bad_s3_source") from None
        except ValueError as error:
            raise ValidationFailed(str(error), code="bad_s3_uri") from None
        except StorageError as error:
            raise DependencyUnavailable(
                f"Could not read {self.uri}: {error}", code="s3_unavailable"
            ) from None


def _stage_folder(source_dir: Path, dest: Path, limits: IngestLimits) -> StagedArtifact:
    entries = list(source_dir.iterdir())
    # An S3 prefix or run folder holding one archive is treated like an uploaded archive.
    if len(entries) == 1 and entries[0].is_file() and not entries[0].name.endswith(".json"):
        return stage_upload([_LocalFile(entries[0])], dest, limits)
    return stage_directory(source_dir, dest, limits)


class _LocalFile:
    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.size = path.stat().st_size

    def chunks(self, chunk_size: int = 1024 * 1024):
        with self.path.open("rb") as handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def temporary_file_path(self) -> str:
        return str(self.path)


# --- copying a user-given S3 URI ----------------------------------------------------------


def _relative_target(dest_dir: Path, rel: str) -> Path:
    try:
        validate_key(rel)
    except ValueError as exc:
        raise SourceRejected(f"object name {rel!r} is not a safe relative path") from exc
    target = dest_dir.joinpath(*rel.split("/"))
    if dest_dir.resolve() not in target.resolve().parents:
        raise SourceRejected(f"object name {rel!r} would be written outside the destination")
    return target


def download_s3_prefix(
    uri: str,
    dest_dir: Path,
    *,
    max_files: int,
    max_total_bytes: int,
    client=None,
    **client_options: Any,
) -> list[Path]:
    """Copy the object or the folder at `uri` into `dest_dir`; return the files written.

    `s3://b/path/model.tar` names one object if it exists, otherwise the folder
    `path/model.tar/`. Every key is checked before anything is downloaded, and the
    byte limit is enforced again while streaming in case objects grow meanwhile.
    On any error the files written so far are removed.
    """
    bucket, key = parse_s3_uri(uri)
    if client is None:
        client = make_s3_client(**client_options)
    dest_dir = Path(dest_dir)
    where = f"s3://{bucket}/{key}"

    def fail(action: str, exc: BaseException) -> Exception:
        code = error_code(exc)
        if code in ("NoSuchBucket",):
            return SourceRejected(f"bucket {bucket!r} does not exist")
        if code in DENIED_CODES:
            return SourceRejected(f"access to {where} denied ({code})")
        return StorageError(f"{action} {where} failed: {exc}")

    def call(action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_boto_error(exc):
                raise fail(action, exc) from exc
            raise

    # (key, relative name, size)
    plan: list[tuple[str, str, int]] = []
    single = None
    if key and not key.endswith("/"):
        try:
            single = client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if error_code(exc) not in NOT_FOUND_CODES:
                if is_boto_error(exc):
                    raise fail("head", exc) from exc
                raise
    if single is not None:
        plan.append((key, key.rpartition("/")[2], single["ContentLength"]))
    else:
        prefix = key if not key or key.endswith("/") else key + "/"
        paginator = client.get_paginator("list_objects_v2")
        pages = call("list", lambda: list(_limited_pages(paginator, bucket, prefix, max_files)))
        for obj in pages:
            if obj["Key"].endswith("/") and obj["Size"] == 0:
                continue  # "folder" marker written by consoles
            plan.append((obj["Key"], obj["Key"][len(prefix) :], obj["Size"]))
        if not plan:
            raise SourceRejected(f"nothing found at {where}")

    if len(plan) > max_files:
        raise SourceRejected(f"{where} holds more than {max_files} files")
    total = sum(size for _k, _r, size in plan)
    if total > max_total_bytes:
        raise SourceRejected(
            f"{where} holds {total} bytes, more than the limit of {max_total_bytes}"
        )
    targets = [_relative_target(dest_dir, rel) for _k, rel, _s in plan]
    # "a" as a file and "a/b" as a file cannot both exist on disk.
    names = {t for t in targets}
    for t in targets:
        if any(p in names for p in t.parents):
            raise SourceRejected(f"{where} has an object that is also a folder: {t.name!r}")

    written: list[Path] = []
    received = 0
    try:
        for (obj_key, _rel, _size), target in zip(plan, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            resp = call("read", client.get_object, Bucket=bucket, Key=obj_key)
            with resp["Body"] as body, open(target, "xb") as out:
                written.append(target)
                while True:
                    chunk = call("read", body.read, COPY_BUFFER)
                    if not chunk:
                        break
                    received += len(chunk)
                    if received > max_total_bytes:
                        raise SourceRejected(
                            f"{where} grew past the limit of {max_total_bytes} bytes while copying"
                        )
                    out.write(chunk)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return targets


def _limited_pages(paginator, bucket: str, prefix: str, max_files: int):
    """Yield listed objects, stopping one past max_files so huge prefixes end early."""
    count = 0
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            yield obj
            count += 1
            if count > max_files:
                return
