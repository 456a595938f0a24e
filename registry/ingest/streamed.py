"""Uploads streamed into the artifact store while the request arrives.

Without this, a 500 MB upload crossed the disk three times before reaching the
store: Django's temporary file, the staging copy, then the upload. Here each
loose file part goes straight to the store under the new version's prefix while
it is hashed and counted, and only the bytes validation reads (all of a small
file, the header of a safetensors file) are written locally, into a sparse file
of the real size. `inspect_adapter` runs on that folder unchanged (the weights'
values, absent there, are scanned as they stream past: TensorValues), and the
manifest is computed exactly as `stage_upload` computes it, so duplicate
detection sees no difference between the paths.

A tar archive (.tar.gz, .tgz, .tar: anything staging would read as a tar) is
unpacked while it arrives: staging's own tar reader runs in a thread over the
request's bytes, with every rule it applies to a staged archive (names, links,
devices, sizes, entries, the compression ratio), and each member goes into the
store the way a loose file does. A zip keeps its directory at the end, so it
cannot be read before it has all arrived: it keeps the staging path (spooled
to disk), as does any upload whose body was read before the view ran.

Every file's bytes pass through `_Incoming.write`, the one place where the
digest, the store writer, the local head and the per-file checks (`file_checks`)
see them. Whatever fails, every object written is deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import queue
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from core.body_limit import insert_upload_handler
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
    _kind,
    _read_tar,
    _Writer,
    check_flat_layout,
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
# Request chunks waiting for the archive reader: 16 x 64 KiB. Full, it makes
# the request wait for the store instead of buffering the upload.
PIPE_DEPTH = 16


class FileCheck(Protocol):
    """A per-file check fed each file's bytes in order as they arrive (a
    safetensors file's start is its header). `finish` runs once the last byte
    has passed and before the object is committed; either may raise
    ArtifactRejected, which refuses the whole upload."""

    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...


# Given a file's final name, a check for it, or None when it has nothing to check.
FileCheckFactory = Callable[[str], FileCheck | None]


class StreamedUpload(UploadedFile):
    """What request.FILES holds for a streamed part: its name and size, no bytes."""

    def __init__(self, name: str, size: int):
        import io

        super().__init__(io.BytesIO(), name=name, size=size)


@dataclass
class StreamedArtifact:
    """The IncomingArtifact of a streamed upload: files already in the store under
    `prefix`; `staged.root` is the local folder of sparse copies that
    inspect_adapter reads."""

    prefix: str
    staged: StagedArtifact
    handler: StreamingIngestHandler
    source_uri: str = ""

    @property
    def stored_prefix(self) -> str:
        return self.prefix

    def stage(self, workdir: Path, limits: IngestLimits) -> StagedArtifact:
        # Staged while it arrived, under the same limits.
        return self.staged

    def discard(self) -> None:
        self.handler.discard()

    def close(self) -> None:
        self.handler.close()


class _Incoming:
    """One file on its way: hashed, checked, stored, its head kept in a local file."""

    def __init__(
        self,
        name: str,
        writer: ArtifactWriter,
        head_path: Path,
        checks: Sequence[FileCheckFactory] = (),
    ):
        self.name = name
        self.writer = writer
        self.digest = hashlib.sha256()
        self.size = 0
        self.checks = [check for make in checks if (check := make(name)) is not None]
        self.head = open(head_path, "xb")  # noqa: SIM115 - closed in finish()/close()
        self.safetensors = name.endswith(".safetensors")
        self.head_wanted = 8 if self.safetensors else SMALL_HEAD_BYTES
        self._first = b""
        # Issue 14: the local copy keeps only the header, so the weights' values
        # are scanned here, on the one pass the bytes make on their way to the store.
        self.values = TensorValues() if name == WEIGHTS_NAME else None

    def write(self, chunk: bytes) -> None:
        # Every streamed byte passes here, loose file or archive member.
        self.digest.update(chunk)
        if self.values is not None:
            self.values.feed(chunk)
        for check in self.checks:
            check.write(chunk)
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
        for check in self.checks:
            check.finish()
        # Sparse: the real size, with only the head's bytes on disk.
        self.head.truncate(self.size)
        self.head.close()
        self.writer.commit()
        return StagedFile(self.name, self.size, self.digest.hexdigest())

    def close(self) -> None:
        self.head.close()
        self.writer.abort()


class _Aborted(Exception):
    """The request side gave up; the archive reader stops where it is."""


class _Pipe(io.RawIOBase):
    """Request chunks handed to the archive reader's thread, in order.

    Bounded: a full pipe makes the request thread wait for the reader (and so
    for the store), never buffer the upload. `read` returns short only at the end.
    """

    def __init__(self, depth: int = PIPE_DEPTH):
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._buffer = memoryview(b"")
        self._ended = False
        self.aborted = threading.Event()
        self.reader_done = threading.Event()

    def readable(self) -> bool:
        return True

    def put(self, chunk: bytes | None) -> None:
        """Hand over a chunk (None: the upload ended). Dropped once the reader
        has stopped: a tar ends before the stream does (padding, the gzip trailer)."""
        while not self.reader_done.is_set():
            try:
                self._queue.put(chunk, timeout=0.1)
                return
            except queue.Full:
                continue

    def abort(self) -> None:
        self.aborted.set()
        # Unblock a reader waiting for data.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def readinto(self, buffer) -> int:
        wanted = len(buffer)
        filled = 0
        while filled < wanted:
            if self.aborted.is_set():
                raise _Aborted
            if not self._buffer:
                if self._ended:
                    break
                chunk = self._queue.get()
                if chunk is None:
                    self._ended = True
                    continue
                self._buffer = memoryview(chunk)
            n = min(wanted - filled, len(self._buffer))
            buffer[filled : filled + n] = self._buffer[:n]
            self._buffer = self._buffer[n:]
            filled += n
        return filled


class _MemberWriter(_Writer):
    """staging's archive writer, with each member going to the store instead of
    a scratch file; every limit and layout rule is staging's own."""

    def __init__(self, handler: StreamingIngestHandler):
        super().__init__(scratch=Path(), limits=handler.limits)
        self.handler = handler
        self.stored: set[str] = set()

    def add_file(self, parts, shown, read) -> None:
        self.claim(parts, shown)
        # Only a flat archive, or one wrapped in a single folder, is accepted, so
        # a file's final name is its last component, known now. A deeper path or
        # a second file of that name means check_flat_layout refuses the archive
        # at the end, after the rest was read as staging reads it: its bytes are
        # counted, not kept.
        name = parts[-1]
        item = None
        if len(parts) <= 2 and name not in self.stored:
            item = self.handler._start(name)
            self.stored.add(name)
        size = 0
        while chunk := read(CHUNK_SIZE):
            size += len(chunk)
            self.count_bytes(shown, size, len(chunk))
            if item is not None:
                item.write(chunk)
        sha = self.handler._finish(item).sha256 if item is not None else ""
        self.files[parts] = (None, size, sha)


class _ArchiveStream:
    """A tar read by staging's reader in a thread while its bytes arrive."""

    def __init__(self, handler: StreamingIngestHandler, name: str):
        self.name = name
        self.received = 0
        self.error: BaseException | None = None
        self._pipe = _Pipe()
        self._writer = _MemberWriter(handler)
        self._thread = threading.Thread(target=self._read, name="ingest-tar", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            _read_tar(self._pipe, self._writer)
            check_flat_layout(self._writer)
        except _Aborted:
            pass
        except BaseException as error:  # handed to the request thread
            self.error = error
        finally:
            self._pipe.reader_done.set()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def feed(self, chunk: bytes) -> None:
        self._raise()
        self.received += len(chunk)
        self._pipe.put(chunk)

    def finish(self) -> int:
        """Wait for the reader; raise what it raised. Returns the bytes received."""
        self._pipe.put(None)
        self._thread.join()
        self._raise()
        return self.received

    def abort(self) -> None:
        """Stop the reader and wait for it, so nothing is written after this."""
        self._pipe.abort()
        self._thread.join()


def streamable(field_name: str, file_name: str | None) -> bool:
    # Only names stage_upload always takes as loose files; anything else (an
    # archive, or a name it would sniff by magic bytes) keeps the staging path.
    name = _basename(file_name or "").lower()
    return field_name == FIELD and name.endswith(LOOSE_SUFFIXES)


def _archive_named(field_name: str, file_name: str | None) -> bool:
    return field_name == FIELD and _basename(file_name or "").lower().endswith(ARCHIVE_SUFFIXES)


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
        file_checks: Sequence[FileCheckFactory] = (),
    ):
        super().__init__(request)
        self.prefix = prefix
        self.store = store
        self.limits = limits
        self.staging_root = Path(staging_root)
        self.file_checks = tuple(file_checks)
        self.workdir: Path | None = None
        self.files: list[StagedFile] = []
        self.tensor_values: TensorValues | None = None
        self.total = 0
        self.entries = 0
        self.parts = 0  # `files` parts seen, streamed or not
        self._current: _Incoming | None = None
        self._opened = False
        # An archive part: maybe one (its first bytes decide), or the one being read.
        self._maybe_archive: str | None = None
        self._archive: _ArchiveStream | None = None

    # --- Django's handler interface -------------------------------------------------

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        self._current = None
        self._maybe_archive = None
        if field_name == FIELD:
            self.parts += 1
        if self._archive is not None and field_name == FIELD:
            with self._guard():
                raise _mixed(self._archive.name)
        if _archive_named(field_name, file_name) and self.parts == 1:
            # Decided by the first bytes, as staging decides; the default
            # handlers are set up too, in case they take it (a zip).
            self._maybe_archive = file_name
            return
        if not streamable(field_name, file_name):
            return
        with self._guard():
            self._current = self._open(file_name)
        raise StopFutureHandlers

    def receive_data_chunk(self, raw_data, start):
        if self._maybe_archive is not None:
            name, self._maybe_archive = self._maybe_archive, None
            if start == 0 and _kind(raw_data[:512]) in ("gzip", "tar"):
                with self._guard():
                    self._archive = _ArchiveStream(self, _basename(name))
        if self._archive is not None:
            with self._guard():
                self._archive.feed(raw_data)
            return None
        if self._current is None:
            return raw_data
        with self._guard():
            self._write(self._current, raw_data)
        return None

    def file_complete(self, file_size):
        self._maybe_archive = None
        if self._archive is not None:
            with self._guard():
                size = self._archive.finish()
            return StreamedUpload(self._archive.name, size)
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
            if self._archive is not None:
                if len(uploads) != 1:
                    raise _mixed(self._archive.name)
                return self._streamed(sorted(self.files, key=lambda f: f.path))
            others = [u for u in uploads if not isinstance(u, StreamedUpload)]
            for upload in others:
                if _basename(upload.name).lower().endswith(ARCHIVE_SUFFIXES):
                    raise _mixed(_basename(upload.name))
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
            return self._streamed(sorted(self.files, key=lambda f: f.path))

    def _streamed(self, files: list[StagedFile]) -> StreamedArtifact:
        staged = StagedArtifact(
            root=self._root(),
            files=tuple(files),
            total_size=sum(f.size for f in files),
            manifest_sha256=manifest_sha256(files),
            tensor_values=self.tensor_values,
        )
        return StreamedArtifact(prefix=self.prefix, staged=staged, handler=self)

    def discard(self) -> None:
        """Delete everything written to the store and locally. Safe to repeat."""
        if self._archive is not None:
            self._archive.abort()  # first, so that nothing is written after the delete
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
        return self._start(name)

    def _start(self, name: str) -> _Incoming:
        """A checked file name on its way to the store."""
        root = self._root()
        self._opened = True
        writer = self.store.open_write(f"{self.prefix}/{name}")
        try:
            self._current = _Incoming(name, writer, root / name, self.file_checks)
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


def _mixed(archive: str) -> ArtifactRejected:
    return ArtifactRejected(
        "unsupported_upload_type",
        f"{archive!r} is an archive uploaded together with other files. Upload "
        "either one archive or the loose adapter files, not both.",
        415,
    )


def rejection_error(rejection: ArtifactRejected) -> ValidationFailed:
    error = ValidationFailed(rejection.message, code=rejection.code)
    # Keep the library's 413 (size limits) and 415 (unsupported type).
    error.status = rejection.status
    return error


def install_streaming_handler(request, *, prefix: str, store, limits, staging_root, file_checks=()):
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
        django_request,
        prefix=prefix,
        store=store,
        limits=limits,
        staging_root=staging_root,
        file_checks=file_checks,
    )
    return handler if insert_upload_handler(django_request, handler) else None
