"""Stage an untrusted upload (one archive, or loose files) into a directory.

Everything is streamed in fixed-size chunks and hashed on the way, so memory
stays flat whether the adapter is 10 MB or 1 GB. Nothing from the archive is
trusted: names are checked before anything is written, sizes are counted from
the bytes actually produced, and on any rejection `dest` is emptied again.

Files are first written under a hidden scratch directory inside `dest` with
numbered names, and only renamed to their final flat names once the whole
archive has been read, because a streamed tar only reveals its layout (e.g. a
single "my-adapter/" prefix to flatten) at the end.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from .adapter_validation import WEIGHTS_NAME
from .errors import ArtifactRejected
from .tensor_values import TensorValues

CHUNK_SIZE = 1024 * 1024
# The compression-ratio check only starts once this much compressed input has
# been read, so a tiny, very compressible config file cannot trip it.
RATIO_FLOOR_BYTES = 64 * 1024
# The raw (compressed) upload may exceed the uncompressed limit by container
# overhead only.
ARCHIVE_OVERHEAD_BYTES = 1024 * 1024
MAX_NAME_BYTES = 255
MAX_TAR_META_BYTES = 64 * 1024
MAX_ZIP_DIRECTORY_BYTES = 16 * 1024**2
SCRATCH_DIR = ".incoming"

LOOSE_SUFFIXES = (
    ".safetensors",
    ".json",
    ".bin",
    ".pt",
    ".pth",
    ".pkl",
    ".pickle",
    ".ckpt",
    ".md",
    ".txt",
    ".model",
    ".yaml",
    ".yml",
)
ARCHIVE_SUFFIXES = (
    ".zip",
    ".tar",
    ".tgz",
    ".gz",
    ".bz2",
    ".xz",
    ".zst",
    ".7z",
    ".rar",
    ".tbz2",
    ".txz",
)


@dataclass(frozen=True)
class IngestLimits:
    max_total_bytes: int = 2 * 1024**3  # uncompressed total
    max_entries: int = 64
    max_file_bytes: int = 2 * 1024**3
    max_compression_ratio: int = 200  # per-archive, to stop zip bombs early


@dataclass(frozen=True)
class StagedFile:
    path: str  # relative posix, e.g. "adapter_config.json"
    size: int
    sha256: str


@dataclass(frozen=True)
class StagedArtifact:
    root: Path
    files: tuple[StagedFile, ...]
    total_size: int
    # The content identity used for duplicate detection.
    manifest_sha256: str
    # The weights' value scan, fed while they were copied (None without weights).
    tensor_values: TensorValues | None = field(default=None, compare=False, repr=False)

    def file(self, path: str) -> StagedFile | None:
        return next((f for f in self.files if f.path == path), None)


class UploadSource(Protocol):
    """Django's UploadedFile fits, so does any object with a name and chunks()."""

    name: str

    def chunks(self, chunk_size: int = ...) -> Iterator[bytes]: ...


def manifest_sha256(files: Sequence[StagedFile]) -> str:
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\t{f.size}\t{f.sha256}\n".encode())
    return digest.hexdigest()


def clear_directory(path: Path) -> None:
    """Delete everything inside `path`, keeping `path` itself."""
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def stage_upload(
    sources: Sequence[UploadSource], dest: Path, limits: IngestLimits
) -> StagedArtifact:
    """Stage ONE archive (.tar.gz/.tgz/.tar/.zip, detected by magic bytes) or
    several loose files (their basenames are used) into the empty directory
    `dest`. Raises ArtifactRejected and leaves `dest` empty on any problem."""
    return _staged(dest, lambda writer: _read_sources(sources, writer, limits), limits)


def stage_directory(src: Path, dest: Path, limits: IngestLimits) -> StagedArtifact:
    """Same as stage_upload, from a local directory (MLflow / S3 downloads).
    Hidden files and directories (e.g. huggingface_hub's .cache/) are ignored."""
    return _staged(dest, lambda writer: _read_directory(Path(src), writer, limits), limits)


# --- names -----------------------------------------------------------------


def _check_name(name: str) -> tuple[str, ...]:
    """Return the path components of an archive entry name, or reject it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "backslashreplace").decode()
        raise ArtifactRejected(
            "non_utf8_name",
            f"Entry name {shown!r} is not valid UTF-8. Rename the file using UTF-8 "
            "(plain ASCII names like adapter_config.json are best).",
        ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ArtifactRejected(
            "unsafe_name",
            f"Entry name {name!r} contains control characters; rename the file.",
        )
    if "\\" in name or re.match(r"^[A-Za-z]:", name):
        raise ArtifactRejected(
            "windows_path",
            f"Entry name {name!r} contains a backslash or a drive letter. Archive "
            "paths must use forward slashes and be relative; re-create the archive "
            "with tar or zip on the adapter folder.",
        )
    if name.startswith("/"):
        raise ArtifactRejected(
            "absolute_path",
            f"Entry {name!r} has an absolute path. Archive entries must be relative, "
            "e.g. adapter_config.json.",
        )
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ArtifactRejected(
            "path_traversal",
            f"Entry {name!r} contains a '..' component that would escape the adapter folder.",
        )
    if any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise ArtifactRejected(
            "unsafe_name",
            f"Entry name {name[:80]!r}... has a component over 255 bytes.",
        )
    return parts


def _ignored(parts: tuple[str, ...]) -> bool:
    # Hidden files and macOS metadata (.DS_Store, ._foo, __MACOSX/) are never
    # part of an adapter; they are skipped, never written.
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


# --- writing with budgets -----------------------------------------------------


def require_entry_count(entries: int, limits: IngestLimits) -> None:
    """The one entry-count rule for archives, loose files and streamed uploads."""
    if entries > limits.max_entries:
        raise ArtifactRejected(
            "too_many_entries",
            f"The upload has more than {limits.max_entries} entries. A LoRA "
            "adapter needs only adapter_config.json and adapter_model.safetensors.",
            413,
        )


class _Writer:
    """Writes entries into the scratch directory while enforcing the limits."""

    def __init__(self, scratch: Path, limits: IngestLimits) -> None:
        self.scratch = scratch
        self.limits = limits
        self.entries = 0
        self.total = 0
        # (scratch path, size, sha256); the path is None for an entry that was
        # counted but not kept (registry.ingest.streamed's _MemberWriter).
        self.files: dict[tuple[str, ...], tuple[Path | None, int, str]] = {}
        self.values: dict[tuple[str, ...], TensorValues] = {}
        self.dirs: set[tuple[str, ...]] = set()
        # Returns compressed bytes read so far; None when there is no compression.
        self.compressed: Callable[[], int] | None = None

    def count_entry(self) -> None:
        self.entries += 1
        require_entry_count(self.entries, self.limits)

    def claim(self, parts: tuple[str, ...], shown: str) -> None:
        if parts in self.files or parts in self.dirs:
            raise ArtifactRejected(
                "duplicate_entry",
                f"{shown!r} appears more than once in the upload; each file name must be unique.",
            )

    def add_dir(self, parts: tuple[str, ...]) -> None:
        if parts:
            self.dirs.add(parts)

    def add_file(self, parts: tuple[str, ...], shown: str, read: Callable[[int], bytes]) -> None:
        self.claim(parts, shown)
        target = self.scratch / str(len(self.files))
        digest = hashlib.sha256()
        size = 0
        # The weights' values are scanned on this one pass over their bytes (issue 14).
        values = TensorValues() if parts[-1] == WEIGHTS_NAME else None
        if values is not None:
            self.values[parts] = values
        with open(target, "xb") as out:
            while chunk := read(CHUNK_SIZE):
                size += len(chunk)
                self.count_bytes(shown, size, len(chunk))
                digest.update(chunk)
                if values is not None:
                    values.feed(chunk)
                out.write(chunk)
        self.files[parts] = (target, size, digest.hexdigest())

    def count_bytes(self, shown: str, file_size: int, added: int) -> None:
        """`added` more bytes of `shown`, now `file_size` long: every size limit."""
        self.total += added
        if file_size > self.limits.max_file_bytes:
            raise ArtifactRejected(
                "file_too_large",
                f"{shown!r} is larger than the {_human(self.limits.max_file_bytes)} "
                "per-file limit.",
                413,
            )
        if self.total > self.limits.max_total_bytes:
            raise ArtifactRejected(
                "upload_too_large",
                "The uncompressed upload is larger than the "
                f"{_human(self.limits.max_total_bytes)} limit.",
                413,
            )
        self.check_ratio()

    def check_ratio(self, uncompressed: int | None = None, compressed: int | None = None) -> None:
        if compressed is None:
            if self.compressed is None:
                return
            compressed = self.compressed()
        if uncompressed is None:
            uncompressed = self.total
        ratio = self.limits.max_compression_ratio
        if uncompressed > ratio * max(compressed, RATIO_FLOOR_BYTES):
            raise ArtifactRejected(
                "compression_bomb",
                f"The archive expands more than {ratio}x; this looks like a "
                "decompression bomb and was not unpacked.",
                413,
            )


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "bytes" else f"{n:.4g} {unit}"
        n /= 1024
    raise AssertionError


def _staged(dest: Path, fill: Callable[[_Writer], None], limits: IngestLimits) -> StagedArtifact:
    dest = Path(dest)
    if any(dest.iterdir()):
        raise ValueError(f"staging directory {dest} is not empty")
    try:
        scratch = dest / SCRATCH_DIR
        scratch.mkdir()
        writer = _Writer(scratch, limits)
        fill(writer)
        return _finish(writer, dest)
    except BaseException:
        clear_directory(dest)
        raise


def check_flat_layout(writer: _Writer) -> None:
    """Every file at the top level, or all inside one single folder (flattened
    away): then each file's final name is its last path component."""
    if not writer.files:
        raise ArtifactRejected(
            "empty_upload",
            "The upload contains no files. Send adapter_config.json and "
            "adapter_model.safetensors, or an archive of the adapter folder.",
        )
    paths = list(writer.files)
    # A single wrapping folder ("my-adapter/...") is flattened away.
    prefix: tuple[str, ...] = ()
    if all(len(p) == 2 for p in paths) and len({p[0] for p in paths}) == 1:
        prefix = paths[0][:1]
    for parts in paths:
        if parts[: len(prefix)] != prefix or len(parts) != len(prefix) + 1:
            _reject_nested(parts)
    for parts in writer.dirs:
        if parts != prefix:
            _reject_nested(parts)


def _finish(writer: _Writer, dest: Path) -> StagedArtifact:
    check_flat_layout(writer)
    files = []
    values = None
    for parts, (tmp, size, sha) in writer.files.items():
        name = parts[-1]
        assert tmp is not None, "this writer keeps every entry"
        os.replace(tmp, dest / name)
        files.append(StagedFile(name, size, sha))
        values = writer.values.get(parts) or values
    writer.scratch.rmdir()
    files.sort(key=lambda f: f.path)
    return StagedArtifact(
        root=dest,
        files=tuple(files),
        total_size=sum(f.size for f in files),
        manifest_sha256=manifest_sha256(files),
        tensor_values=values,
    )


def _reject_nested(parts: tuple[str, ...]) -> None:
    raise ArtifactRejected(
        "nested_directory",
        f"'{'/'.join(parts)}' is inside a subdirectory. PEFT adapters are flat: put "
        "adapter_config.json and adapter_model.safetensors at the top level of the "
        "archive (or inside one single folder).",
    )


# --- upload sources ---------------------------------------------------------------


class _ChunkReader(io.RawIOBase):
    """A read()-able stream over an iterator of chunks; read(n) returns n bytes
    unless at EOF, which tarfile's compression detection relies on."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._offset = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = 1 << 62
        parts = []
        wanted = size
        while wanted > 0:
            if self._offset >= len(self._buffer):
                try:
                    self._buffer = next(self._chunks)
                except StopIteration:
                    break
                self._offset = 0
                continue
            piece = self._buffer[self._offset : self._offset + wanted]
            self._offset += len(piece)
            wanted -= len(piece)
            parts.append(piece)
        return b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Counting:
    """Counts the bytes handed to a consumer (the compressed input size)."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data


class _Prefixed:
    """Re-attaches bytes already read (for magic detection) in front of a stream."""

    def __init__(self, head: bytes, raw) -> None:
        self.head = head
        self.raw = raw

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size is None or size < 0:
                data, self.head = self.head + self.raw.read(), b""
                return data
            data, self.head = self.head[:size], self.head[size:]
            if len(data) < size:
                data += self.raw.read(size - len(data))
            return data
        return self.raw.read(size)


def _seekable_file(source) -> BinaryIO | None:
    file = getattr(source, "file", None)
    try:
        if file is not None and file.seekable():
            file.seek(0)
            return file
    except (AttributeError, OSError, ValueError):
        pass
    return None


def _is_seekable(file) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _basename(name: str) -> str:
    return PurePosixPath(name or "").name


def _kind(head: bytes) -> str:
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head.startswith(
        (b"BZh", b"\xfd7zXZ\x00", b"7z\xbc\xaf\x27\x1c", b"Rar!", b"\x28\xb5\x2f\xfd")
    ):
        return "unsupported"
    return "file"


def _read_sources(sources: Sequence[UploadSource], writer: _Writer, limits: IngestLimits) -> None:
    if not sources:
        raise ArtifactRejected("empty_upload", "No file was uploaded.")
    if len(sources) > limits.max_entries:
        writer.entries = len(sources) - 1
        writer.count_entry()
    with ExitStack() as stack:
        opened = []
        for source in sources:
            raw = _open_source(source, stack)
            head = raw.read(512)
            name = _basename(source.name).lower()
            if name.endswith(ARCHIVE_SUFFIXES):
                kind = _kind(head) if len(sources) == 1 else "unsupported"
                kind = "unsupported" if kind == "file" else kind
            elif name.endswith(LOOSE_SUFFIXES) or len(sources) > 1:
                # A safetensors header length can start with gzip's magic bytes,
                # and torch .pt/.bin files are zips: a file named like an
                # adapter file is taken as one.
                kind = "file"
            else:
                kind = _kind(head)
            opened.append((source, raw, head, kind))
        if len(opened) == 1:
            source, raw, head, kind = opened[0]
            if not head:
                raise ArtifactRejected(
                    "empty_upload",
                    f"The uploaded file {_basename(source.name)!r} is empty.",
                )
            if kind in ("gzip", "tar"):
                return _read_tar(_Prefixed(head, raw), writer)
            if kind == "zip":
                return _read_zip(source, _Prefixed(head, raw), writer, stack)
            if kind != "file":
                raise ArtifactRejected(
                    "unsupported_upload_type",
                    f"{_basename(source.name)!r} is not a supported archive. Upload a "
                    ".tar.gz, .tgz, .tar or .zip of the adapter folder, or the adapter "
                    "files themselves.",
                    415,
                )
        for source, raw, head, kind in opened:
            name = _basename(source.name)
            if kind != "file":
                raise ArtifactRejected(
                    "unsupported_upload_type",
                    f"{name!r} is an archive uploaded together with other files. Upload "
                    "either one archive or the loose adapter files, not both.",
                    415,
                )
            parts = _check_name(name)
            if len(parts) != 1 or _ignored(parts):
                raise ArtifactRejected(
                    "unsafe_name",
                    f"Uploaded file name {source.name!r} is not a plain file name.",
                )
            writer.count_entry()
            writer.add_file(parts, name, _Prefixed(head, raw).read)
        if writer.total == 0:
            raise ArtifactRejected("empty_upload", "The uploaded files are all empty.")


def _open_source(source: UploadSource, stack: ExitStack):
    path = getattr(source, "temporary_file_path", None)
    if callable(path):
        return stack.enter_context(open(path(), "rb"))
    file = _seekable_file(source)
    if file is not None:
        return file
    return _ChunkReader(iter(source.chunks(CHUNK_SIZE)))


def _corrupt(kind: str, error: Exception) -> ArtifactRejected:
    return ArtifactRejected(
        "corrupt_archive",
        f"The {kind} archive could not be read ({type(error).__name__}: {error}). "
        "It may be truncated; re-create it and upload again.",
    )


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads pax and GNU long-name headers whole into memory; a hostile
    archive could declare one of gigabytes (zeros gzip to almost nothing)."""

    def _proc_member(self, tarfile_):
        if self.type in _TAR_META_TYPES and self.size > MAX_TAR_META_BYTES:
            raise ArtifactRejected(
                "oversized_tar_header",
                f"The archive has a {self.size}-byte extended header; at most "
                f"{MAX_TAR_META_BYTES} bytes are accepted.",
                413,
            )
        return super()._proc_member(tarfile_)


_TAR_META_TYPES = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


def _read_tar(raw, writer: _Writer) -> None:
    counting = _Counting(raw)
    writer.compressed = lambda: counting.count
    try:
        # "r|*": a forward-only stream, so gzip is decompressed incrementally
        # and nothing is seeked or buffered whole.
        # typeshed wants every mode's fileobj to write, seek and tell; a
        # stream ("r|") only reads.
        with tarfile.open(  # type: ignore[call-overload]
            fileobj=counting,
            mode="r|*",
            encoding="utf-8",
            errors="surrogateescape",
            tarinfo=_BoundedTarInfo,
        ) as archive:
            for member in archive:
                writer.count_entry()
                parts = _check_name(member.name)
                if member.issym():
                    raise ArtifactRejected(
                        "symlink",
                        f"Entry {member.name!r} is a symbolic link; archives must contain "
                        "regular files only.",
                    )
                if member.islnk():
                    raise ArtifactRejected(
                        "hardlink",
                        f"Entry {member.name!r} is a hard link; archives must contain "
                        "regular files only.",
                    )
                if member.isdir():
                    if not _ignored(parts):
                        writer.claim(parts, member.name)
                        writer.add_dir(parts)
                    continue
                if not member.isreg() or member.issparse():
                    raise ArtifactRejected(
                        "special_file",
                        f"Entry {member.name!r} is a device, FIFO or other special file; "
                        "archives must contain regular files only.",
                    )
                if _ignored(parts) or not parts:
                    continue
                if member.size > writer.limits.max_file_bytes:
                    raise ArtifactRejected(
                        "file_too_large",
                        f"{member.name!r} is larger than the "
                        f"{_human(writer.limits.max_file_bytes)} per-file limit.",
                        413,
                    )
                data = archive.extractfile(member)
                writer.add_file(parts, member.name, data.read)
    except (tarfile.TarError, EOFError, OSError, zlib.error, RecursionError) as error:
        # RecursionError: a long chain of pax headers.
        raise _corrupt("tar", error) from None


def _read_zip(source, raw, writer: _Writer, stack: ExitStack) -> None:
    file = raw.raw
    if not _is_seekable(file):
        # zipfile needs to seek (the index is at the end): spool to disk,
        # bounded, rather than into memory.
        file = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        limit = writer.limits.max_total_bytes + ARCHIVE_OVERHEAD_BYTES
        written = 0
        while chunk := raw.read(CHUNK_SIZE):
            written += len(chunk)
            if written > limit:
                raise ArtifactRejected(
                    "upload_too_large",
                    f"The upload is larger than the {_human(limit)} limit.",
                    413,
                )
            file.write(chunk)
    file.seek(0, os.SEEK_END)
    archive_size = file.tell()
    file.seek(0)
    _check_zip_end_record(file, writer.limits)
    try:
        archive = stack.enter_context(zipfile.ZipFile(file))
        infos = archive.infolist()
    except UnicodeDecodeError:
        raise ArtifactRejected(
            "non_utf8_name",
            "An entry name is flagged as UTF-8 but is not valid UTF-8. Rename the "
            "files using UTF-8.",
        ) from None
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        ValueError,
    ) as error:
        raise _corrupt("zip", error) from None
    if len(infos) > writer.limits.max_entries:
        writer.entries = len(infos) - 1
        writer.count_entry()
    # Check every entry before extracting anything.
    plan = []
    for info in infos:
        name = _zip_name(info)
        parts = _check_name(name)
        mode = info.external_attr >> 16
        if info.flag_bits & 0x1:
            raise ArtifactRejected(
                "encrypted_archive",
                f"Entry {name!r} is encrypted; upload an unencrypted archive.",
            )
        if stat.S_ISLNK(mode):
            raise ArtifactRejected(
                "symlink",
                f"Entry {name!r} is a symbolic link; archives must contain regular files only.",
            )
        is_dir = info.is_dir() or stat.S_ISDIR(mode)
        if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and stat.S_IFMT(mode):
            raise ArtifactRejected(
                "special_file",
                f"Entry {name!r} is a device, FIFO or other special file; archives must "
                "contain regular files only.",
            )
        if info.file_size > writer.limits.max_file_bytes:
            raise ArtifactRejected(
                "file_too_large",
                f"{name!r} is larger than the {_human(writer.limits.max_file_bytes)} "
                "per-file limit.",
                413,
            )
        plan.append((info, name, parts, is_dir))
    declared = sum(info.file_size for info in infos)
    if declared > writer.limits.max_total_bytes:
        raise ArtifactRejected(
            "upload_too_large",
            f"The uncompressed upload is larger than the "
            f"{_human(writer.limits.max_total_bytes)} limit.",
            413,
        )
    writer.check_ratio(declared, archive_size)
    # Sizes are also counted from the bytes actually decompressed: zipfile stops
    # at the declared size and fails the CRC check if the data disagrees.
    writer.compressed = lambda: archive_size
    try:
        for info, name, parts, is_dir in plan:
            writer.count_entry()
            if _ignored(parts):
                continue
            if is_dir:
                writer.claim(parts, name)
                writer.add_dir(parts)
                continue
            if not parts:
                continue
            with archive.open(info) as data:
                writer.add_file(parts, name, data.read)
    except (
        zipfile.BadZipFile,
        OSError,
        EOFError,
        zlib.error,
        NotImplementedError,
    ) as error:
        raise _corrupt("zip", error) from None


def _check_zip_end_record(file, limits: IngestLimits) -> None:
    # zipfile loads the whole central directory into memory; refuse a huge
    # one before it does. _EndRecData is private but unchanged since Python 2.
    try:
        end = zipfile._EndRecData(file)  # type: ignore[attr-defined]  # private, not in typeshed
    except OSError:
        end = None
    finally:
        file.seek(0)
    if not end:
        return  # zipfile reports the archive as corrupt
    entries = end[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]  # as above
    directory_size = end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    require_entry_count(entries, limits)
    if directory_size > MAX_ZIP_DIRECTORY_BYTES:
        raise ArtifactRejected(
            "corrupt_archive",
            f"The zip's central directory is {directory_size} bytes, far larger than "
            f"{limits.max_entries} entries need.",
        )


def _zip_name(info: zipfile.ZipInfo) -> str:
    if info.flag_bits & 0x800:
        return info.filename
    # Without the UTF-8 flag zipfile decodes names as cp437. Many tools write
    # UTF-8 anyway, so recover the raw bytes and require them to be UTF-8.
    raw = info.orig_filename.encode("cp437")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape")


# --- local directories ------------------------------------------------------------


def _read_directory(src: Path, writer: _Writer, limits: IngestLimits) -> None:
    if not src.is_dir() or src.is_symlink():
        raise ArtifactRejected("empty_upload", f"{src} is not a directory.")
    for current, dirnames, filenames in os.walk(src, followlinks=False):
        base = Path(current)
        rel = base.relative_to(src).parts
        for name in sorted(dirnames):
            parts = (*rel, name)
            info = os.lstat(base / name)
            if stat.S_ISLNK(info.st_mode):
                raise ArtifactRejected(
                    "symlink",
                    f"{'/'.join(parts)!r} is a symbolic link; only regular files are allowed.",
                )
            if _ignored(parts):
                dirnames.remove(name)
                continue
            writer.count_entry()
            writer.add_dir(_check_name("/".join(parts)))
        for name in sorted(filenames):
            parts = _check_name("/".join((*rel, name)))
            info = os.lstat(base / name)
            if stat.S_ISLNK(info.st_mode):
                raise ArtifactRejected(
                    "symlink",
                    f"{'/'.join(parts)!r} is a symbolic link; only regular files are allowed.",
                )
            if not stat.S_ISREG(info.st_mode):
                raise ArtifactRejected(
                    "special_file",
                    f"{'/'.join(parts)!r} is a device, FIFO or other special file.",
                )
            if _ignored(parts):
                continue
            writer.count_entry()
            # O_NOFOLLOW: the file cannot be swapped for a symlink after the check.
            fd = os.open(base / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as data:
                writer.add_file(parts, "/".join(parts), data.read)
