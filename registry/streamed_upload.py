"""Loose adapter files streamed into the artifact store while the request arrives.

Without this, a 500 MB upload crossed the disk three times before reaching the
store: Django's temporary file, the staging copy, then the upload. Here each
loose file part goes straight to the store under the new version's prefix while
it is hashed and counted, and only the bytes validation reads (all of a small
file, the header of a safetensors file) are written locally, into a sparse file
of the real size. `inspect_adapter` runs on that folder unchanged (the weights'
values, absent there, are scanned as they stream past: TensorValues), and the
manifest is computed exactly as `stage_upload` computes it, so duplicate
detection sees no difference between the paths.

Archives, and any upload whose body was read before the view ran, keep the
staging path. The same name rules and limits as `stage_upload` apply, checked
as the bytes arrive. Whatever fails, every object written is deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from core.errors import ValidationFailed
from registry.artifact_store import discard_stored, store_unavailable
from registry.ingest.adapter_validation import WEIGHTS_NAME
from registry.ingest.errors import ArtifactRejected

# The name rules and helpers are stage_upload's own, so both paths refuse the same names.
from registry.ingest.staging import (
    ARCHIVE_SUFFIXES,
    CHUNK_SIZE,
    LOOSE_SUFFIXES,
    IngestLimits,
    StagedArtifact,
    StagedFile,
    _basename,
    _check_name,
    _human,
    _ignored,
    manifest_sha256,
    require_entry_count,
)
from registry.ingest.tensor_values import TensorValues
from registry.storage import ArtifactStore, ArtifactWriter, StorageError

logger = logging.getLogger(__name__)

FIELD = "files"
# adapter_config.json is refused above 1 MiB, so 2 MiB keeps every byte of any
# config validation would read; of other non-weights files only the size matters.
SMALL_HEAD_BYTES = 2 * 1024**2
# read_safetensors_header's own cap: a longer declared header is refused from
# its first 8 bytes, so nothing more is kept.
MAX_SAFETENSORS_HEADER = 100 * 1024**2


class StreamedUpload(UploadedFile):
    """What request.FILES holds for a streamed part: its name and size, no bytes."""

    def __init__(self, name: str, size: int):
        import io

        super().__init__(io.BytesIO(), name=name, size=size)


@dataclass
class StreamedArtifact:
    """Files already in the store under `prefix`; `staged.root` is the local
    folder of sparse copies that inspect_adapter reads."""

    prefix: str
    staged: StagedArtifact
    handler: StreamingIngestHandler

    def discard(self) -> None:
        self.handler.discard()

    def close(self) -> None:
        self.handler.close()


class _Incoming:
    """One file on its way: hashed, counted, its head kept in a local file."""

    def __init__(self, name: str, writer: ArtifactWriter, head_path: Path):
        self.name = name
        self.writer = writer
        self.digest = hashlib.sha256()
        self.size = 0
        self.head = open(head_path, "xb")  # noqa: SIM115 - closed in finish()/close()
        self.safetensors = name.endswith(".safetensors")
        self.head_wanted = 8 if self.safetensors else SMALL_HEAD_BYTES
        self._first = b""
        # Issue 14: the local copy keeps only the header, so the weights' values
        # are scanned here, on the one pass the bytes make on their way to the store.
        self.values = TensorValues() if name == WEIGHTS_NAME else None

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        if self.values is not None:
            self.values.feed(chunk)
        self.writer.write(chunk)
        offset = self.size
        self.size += len(chunk)
        view = memoryview(chunk)
        while offset < self.head_wanted and view:
            piece = view[: self.head_wanted - offset]
            self.head.write(piece)
            offset += len(piece)
            view = view[len(piece) :]
            if self.safetensors and len(self._first) < 8:
                self._first += bytes(piece[: 8 - len(self._first)])
                if len(self._first) == 8:
                    (length,) = struct.unpack("<Q", self._first)
                    if length <= MAX_SAFETENSORS_HEADER:
                        self.head_wanted = 8 + length

    def finish(self) -> StagedFile:
        # Sparse: the real size, with only the head's bytes on disk.
        self.head.truncate(self.size)
        self.head.close()
        self.writer.commit()
        return StagedFile(self.name, self.size, self.digest.hexdigest())

    def close(self) -> None:
        self.head.close()
        self.writer.abort()


def streamable(field_name: str, file_name: str | None) -> bool:
    # Only names stage_upload always takes as loose files; anything else (an
    # archive, or a name it would sniff by magic bytes) keeps the staging path.
    name = _basename(file_name or "").lower()
    return field_name == FIELD and name.endswith(LOOSE_SUFFIXES)


class StreamingIngestHandler(FileUploadHandler):
    """Installed first in request.upload_handlers by the version upload views.

    Parts it does not stream fall through to the next (Django's default) handlers.
    """

    # Django's default. Larger chunks make its multipart parser slower, not
    # faster (measured: 1 MiB chunks parse 500 MB in 1.2 s, 64 KiB in 0.4 s).
    chunk_size = 64 * 1024

    def __init__(
        self,
        request,
        *,
        prefix: str,
        store: ArtifactStore,
        limits: IngestLimits,
        staging_root: Path,
    ):
        super().__init__(request)
        self.prefix = prefix
        self.store = store
        self.limits = limits
        self.staging_root = Path(staging_root)
        self.workdir: Path | None = None
        self.files: list[StagedFile] = []
        self.tensor_values: TensorValues | None = None
        self.total = 0
        self.entries = 0
        self._current: _Incoming | None = None
        self._opened = False

    # --- Django's handler interface -------------------------------------------------

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        self._current = None
        if not streamable(field_name, file_name):
            return
        with self._guard():
            self._current = self._open(file_name)
        raise StopFutureHandlers

    def receive_data_chunk(self, raw_data, start):
        if self._current is None:
            return raw_data
        with self._guard():
            self._write(self._current, raw_data)
        return None

    def file_complete(self, file_size):
        if self._current is None:
            return None
        with self._guard():
            item = self._finish(self._current)
        return StreamedUpload(item.path, item.size)

    def upload_interrupted(self):
        self.discard()

    # --- after parsing ----------------------------------------------------------------

    def artifact(self, uploads) -> StreamedArtifact | None:
        """The streamed artifact for request.FILES' `files`, or None when nothing
        was streamed (an archive: the caller takes the staging path)."""
        uploads = list(uploads or [])
        if not any(isinstance(u, StreamedUpload) for u in uploads):
            return None
        with self._guard():
            others = [u for u in uploads if not isinstance(u, StreamedUpload)]
            for upload in others:
                if _basename(upload.name).lower().endswith(ARCHIVE_SUFFIXES):
                    raise ArtifactRejected(
                        "unsupported_upload_type",
                        f"{_basename(upload.name)!r} is an archive uploaded together with "
                        "other files. Upload either one archive or the loose adapter "
                        "files, not both.",
                        415,
                    )
            # Loose files with unusual names arrived as temporary files; they go
            # the same way, from disk.
            for upload in others:
                item = self._open(upload.name)
                for chunk in upload.chunks(CHUNK_SIZE):
                    self._write(item, chunk)
                self._finish(item)
            if self.total == 0:
                message = (
                    f"The uploaded file {self.files[0].path!r} is empty."
                    if len(self.files) == 1
                    else "The uploaded files are all empty."
                )
                raise ArtifactRejected("empty_upload", message)
            files = sorted(self.files, key=lambda f: f.path)
            staged = StagedArtifact(
                root=self._root(),
                files=tuple(files),
                total_size=self.total,
                manifest_sha256=manifest_sha256(files),
                tensor_values=self.tensor_values,
            )
        return StreamedArtifact(prefix=self.prefix, staged=staged, handler=self)

    def discard(self) -> None:
        """Delete everything written to the store and locally. Safe to repeat."""
        if self._current is not None:
            self._current.close()
            self._current = None
        if self._opened:
            discard_stored(self.store, self.prefix)
        self.close()

    def close(self) -> None:
        """Remove the local folder of sparse copies (the stored objects stay)."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # --- internals ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self):
        try:
            yield
        except ArtifactRejected as rejection:
            self.discard()
            raise rejection_error(rejection) from rejection
        except StorageError as error:
            self.discard()
            raise store_unavailable(error) from None
        except BaseException:
            self.discard()
            raise

    def _root(self) -> Path:
        if self.workdir is None:
            self.staging_root.mkdir(parents=True, exist_ok=True)
            self.workdir = Path(tempfile.mkdtemp(prefix="ingest-", dir=self.staging_root))
            (self.workdir / "artifact").mkdir()
        return self.workdir / "artifact"

    def _open(self, file_name: str) -> _Incoming:
        name = _basename(file_name)
        parts = _check_name(name)
        if len(parts) != 1 or _ignored(parts):
            raise ArtifactRejected(
                "unsafe_name", f"Uploaded file name {file_name!r} is not a plain file name."
            )
        self.entries += 1
        require_entry_count(self.entries, self.limits)
        if any(f.path == name for f in self.files):
            raise ArtifactRejected(
                "duplicate_entry",
                f"{name!r} appears more than once in the upload; each file name must be unique.",
            )
        root = self._root()
        self._opened = True
        writer = self.store.open_write(f"{self.prefix}/{name}")
        try:
            self._current = _Incoming(name, writer, root / name)
        except BaseException:
            writer.abort()
            raise
        return self._current

    def _write(self, item: _Incoming, chunk: bytes) -> None:
        if item.size + len(chunk) > self.limits.max_file_bytes:
            raise ArtifactRejected(
                "file_too_large",
                f"{item.name!r} is larger than the {_human(self.limits.max_file_bytes)} "
                "per-file limit.",
                413,
            )
        if self.total + len(chunk) > self.limits.max_total_bytes:
            raise ArtifactRejected(
                "upload_too_large",
                "The uncompressed upload is larger than the "
                f"{_human(self.limits.max_total_bytes)} limit.",
                413,
            )
        item.write(chunk)
        self.total += len(chunk)

    def _finish(self, item: _Incoming) -> StagedFile:
        staged = item.finish()
        self._current = None
        self.files.append(staged)
        if item.values is not None:
            self.tensor_values = item.values
        return staged


def rejection_error(rejection: ArtifactRejected) -> ValidationFailed:
    error = ValidationFailed(rejection.message, code=rejection.code)
    # Keep the library's 413 (size limits) and 415 (unsupported type).
    error.status = rejection.status
    return error


def install_streaming_handler(request, *, prefix: str, store, limits, staging_root):
    """Put a StreamingIngestHandler in front of the request's upload handlers.

    Returns None, leaving the request alone, when the body is not multipart or
    was already parsed (e.g. a CSRF check read request.POST); then the upload
    takes the staging path.
    """
    django_request = getattr(request, "_request", request)
    if not django_request.content_type.startswith("multipart/form-data"):
        return None
    if hasattr(django_request, "_files"):
        return None
    handler = StreamingIngestHandler(
        django_request, prefix=prefix, store=store, limits=limits, staging_root=staging_root
    )
    try:
        django_request.upload_handlers = [handler, *django_request.upload_handlers]
    except AttributeError:
        return None
    return handler
