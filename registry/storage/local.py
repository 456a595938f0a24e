"""The artifact store on a local (or mounted) filesystem."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from .base import (
    COPY_BUFFER,
    TMP_MARKER,
    ArtifactStore,
    ArtifactWriter,
    ObjectNotFound,
    StorageError,
    StoredObject,
    validate_key,
    validate_prefix,
)


class _LocalWriter(ArtifactWriter):
    """A temp file in the final folder (hidden from listings), renamed on commit."""

    def __init__(self, dest: Path):
        self._dest = dest
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(prefix=TMP_MARKER, dir=dest.parent)
        except OSError as exc:
            raise StorageError(f"cannot write {dest}: {exc.strerror or exc}") from exc
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise StorageError(f"cannot write {self._dest}: {exc.strerror or exc}") from exc

    def commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self._dest)
        except OSError as exc:
            self.abort()
            raise StorageError(f"cannot write {self._dest}: {exc.strerror or exc}") from exc

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)


class LocalArtifactStore(ArtifactStore):
    def __init__(self, root: Path | str):
        root = Path(root)
        if not root.is_absolute():
            raise ValueError(f"local artifact root must be absolute, got {str(root)!r}")
        self.root = root

    def __repr__(self) -> str:
        return f"LocalArtifactStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def _atomic_write(self, dest: Path, src: BinaryIO) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_MARKER, dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, COPY_BUFFER)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> None:
        # The local store keeps no metadata; the registry's database holds the digest.
        dest = self._path(key)
        with open(path, "rb") as src:  # a missing source is the caller's bug: not wrapped
            try:
                self._atomic_write(dest, src)
            except OSError as exc:
                raise StorageError(f"cannot write {dest}: {exc.strerror or exc}") from exc

    def open_write(self, key: str) -> ArtifactWriter:
        return _LocalWriter(self._path(key))

    def open_read(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"no object {key!r} in {self.root}") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def download_to(self, key: str, dest: Path) -> None:
        with self.open_read(key) as src:
            try:
                self._atomic_write(Path(dest), src)
            except OSError as exc:
                raise StorageError(f"cannot write {dest}: {exc.strerror or exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _walk(self, prefix: str) -> list[tuple[str, Path]]:
        # Only walk the deepest directory the prefix names, then string-match.
        head = prefix.rpartition("/")[0]
        base = self.root.joinpath(*head.split("/")) if head else self.root
        found = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(TMP_MARKER):
                    continue
                path = Path(dirpath, name)
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append((key, path))
        found.sort()
        return found

    def list_prefix(self, prefix: str) -> list[StoredObject]:
        validate_prefix(prefix)
        try:
            return [StoredObject(key, path.stat().st_size) for key, path in self._walk(prefix)]
        except OSError as exc:
            raise StorageError(f"cannot list {self.root}: {exc.strerror or exc}") from exc

    def delete_prefix(self, prefix: str) -> None:
        validate_prefix(prefix)
        try:
            dirs: set[Path] = set()
            for _key, path in self._walk(prefix):
                path.unlink(missing_ok=True)
                dirs.update(p for p in path.parents if p != self.root and self.root in p.parents)
            # Deepest first, so emptied parents go too; non-empty ones stay.
            for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
        except OSError as exc:
            raise StorageError(f"cannot delete under {self.root}: {exc.strerror or exc}") from exc

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"artifact root {self.root} cannot be created: {exc.strerror or exc}"
            ) from exc
        if not self.root.is_dir():
            raise StorageError(f"artifact root {self.root} is not a directory")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageError(f"artifact root {self.root} is not writable")
