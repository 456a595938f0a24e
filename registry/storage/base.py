"""The store interface: what every artifact store does, and the key rules.

Stores take keys the registry builds itself ("adapters/<id>/<version>/file"),
so keys are validated the same way for every store, even though S3 would
accept more. Nothing in this package imports Django: `build_artifact_store`
takes plain values and the settings module decides what they are.

`StorageError` means the store is unreachable or misbehaving (the API answers 503).
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

COPY_BUFFER = 1024 * 1024
TMP_MARKER = ".~tmp-"


class StorageError(Exception):
    """The store failed for reasons outside the caller's control."""


class ObjectNotFound(StorageError):
    pass


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative POSIX path, else raise ValueError."""
    if not isinstance(key, str) or not key:
        raise ValueError("storage key must be a non-empty string")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"storage key {key!r} contains a backslash or NUL")
    if key.startswith("/"):
        raise ValueError(f"storage key {key!r} must be relative")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"storage key {key!r} has an empty, '.' or '..' segment")
        if part.startswith(TMP_MARKER):
            raise ValueError(f"storage key {key!r} uses the reserved temp-file prefix")
    return key


def validate_prefix(prefix: str) -> str:
    # An empty prefix would mean "everything"; no caller should need that.
    if not prefix:
        raise ValueError("prefix must not be empty")
    validate_key(prefix.rstrip("/") or "/")
    return prefix


class ArtifactStore(ABC):
    @abstractmethod
    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> None:
        """Store the file at `path` under `key`, streaming it from disk."""

    def open_write(self, key: str) -> ArtifactWriter:
        """A writer for `key`: write() as bytes arrive, then commit() or abort().

        Nothing is visible under `key` before commit(). This fallback spools to a
        temporary file and calls put_file; the stores below stream instead.
        """
        return _SpoolingWriter(self, key)

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """Open `key` for streaming reads; the caller closes it."""

    @abstractmethod
    def download_to(self, key: str, dest: Path) -> None:
        """Write `key` to `dest` (replaced atomically)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[StoredObject]:
        """Objects whose key starts with `prefix` (string match, as in S3), sorted."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix`. Deleting nothing is not an error."""

    @abstractmethod
    def uri(self, key: str) -> str: ...

    @abstractmethod
    def check(self) -> None:
        """Raise StorageError with a readable reason if the store is unusable."""


class ArtifactWriter(ABC):
    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def commit(self) -> None:
        """Make the object visible. StorageError if the store failed."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written; never raises StorageError. Safe to repeat."""


class _SpoolingWriter(ArtifactWriter):
    def __init__(self, store: ArtifactStore, key: str):
        self._store = store
        self._key = validate_key(key)
        self._file = tempfile.NamedTemporaryFile(prefix=TMP_MARKER, delete=False)  # noqa: SIM115

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def commit(self) -> None:
        try:
            self._file.close()
            self._store.put_file(self._key, Path(self._file.name))
        finally:
            Path(self._file.name).unlink(missing_ok=True)

    def abort(self) -> None:
        self._file.close()
        Path(self._file.name).unlink(missing_ok=True)
