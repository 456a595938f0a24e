"""Where adapter artifacts live: a local directory or any S3-compatible bucket.

Both stores take keys the registry builds itself ("adapters/<id>/<version>/file"),
so keys are validated the same way for both, even though S3 would accept more.
Nothing here imports Django: `build_artifact_store` takes plain values and the
settings module decides what they are.

Errors: `StorageError` means the store is unreachable or misbehaving (the API
answers 503). `SourceRejected` is a `ValueError` for problems the user caused
when registering from their own S3 URI (the API answers 400).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

COPY_BUFFER = 1024 * 1024
# S3 rejects multipart parts below 5 MiB (except the last one).
MIN_PART_MB = 5
_TMP_MARKER = ".~tmp-"
STREAM_PART_BYTES = 8 * 1024 * 1024
STREAM_IN_FLIGHT = 3


class StorageError(Exception):
    """The store failed for reasons outside the caller's control."""


class ObjectNotFound(StorageError):
    pass


class SourceRejected(ValueError):
    """A user-given source cannot be imported: missing, empty, too big, unsafe."""


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
        if part.startswith(_TMP_MARKER):
            raise ValueError(f"storage key {key!r} uses the reserved temp-file prefix")
    return key


def _validate_prefix(prefix: str) -> str:
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
        self._file = tempfile.NamedTemporaryFile(prefix=_TMP_MARKER, delete=False)  # noqa: SIM115

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


# --------------------------------------------------------------------------
# Local filesystem
# --------------------------------------------------------------------------


class _LocalWriter(ArtifactWriter):
    """A temp file in the final folder (hidden from listings), renamed on commit."""

    def __init__(self, dest: Path):
        self._dest = dest
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(prefix=_TMP_MARKER, dir=dest.parent)
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
        fd, tmp = tempfile.mkstemp(prefix=_TMP_MARKER, dir=dest.parent)
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
                if name.startswith(_TMP_MARKER):
                    continue
                path = Path(dirpath, name)
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append((key, path))
        found.sort()
        return found

    def list_prefix(self, prefix: str) -> list[StoredObject]:
        _validate_prefix(prefix)
        try:
            return [StoredObject(key, path.stat().st_size) for key, path in self._walk(prefix)]
        except OSError as exc:
            raise StorageError(f"cannot list {self.root}: {exc.strerror or exc}") from exc

    def delete_prefix(self, prefix: str) -> None:
        _validate_prefix(prefix)
        try:
            dirs = set()
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


# --------------------------------------------------------------------------
# S3-compatible
# --------------------------------------------------------------------------

_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_DENIED_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


def make_s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    addressing_style: str = "auto",
    verify_tls: bool | str = True,
    connect_timeout: float = 5,
    read_timeout: float = 60,
    max_attempts: int = 5,
):
    """An S3 client that works against AWS, MinIO and Ceph RGW.

    No credentials given means boto3's default chain (env, profile, IAM role).
    """
    import boto3
    from botocore.config import Config

    if addressing_style not in ("auto", "path", "virtual"):
        raise ValueError(
            f"addressing_style must be auto, path or virtual, not {addressing_style!r}"
        )
    if (access_key is None) != (secret_key is None):
        raise ValueError("give both access_key and secret_key, or neither")
    config = Config(
        region_name=region,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "max_attempts": max_attempts},
        s3={"addressing_style": addressing_style},
        # botocore >= 1.36 sends CRC checksums on every upload by default; several
        # S3-compatible servers (older MinIO, Ceph RGW) reject those requests.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session(
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=session_token,
        region_name=region,
    )
    return session.client("s3", endpoint_url=endpoint_url or None, verify=verify_tls, config=config)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _is_boto_error(exc: BaseException) -> bool:
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, (BotoCoreError, ClientError, Boto3Error))


class _S3Reader(io.RawIOBase):
    """Wraps a get_object body so network failures surface as StorageError."""

    def __init__(self, body, where: str):
        self._body = body
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._body.read(len(buffer))
        except Exception as exc:
            if _is_boto_error(exc) or isinstance(exc, OSError):
                raise StorageError(f"reading {self._where} failed: {exc}") from exc
            raise
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class _S3Writer(ArtifactWriter):
    """A multipart upload fed as bytes arrive. Parts are uploaded by a few
    threads while the caller keeps writing; at most `in_flight` parts wait or
    travel at once, so memory stays near (in_flight + 1) x part_size whatever
    the object's size. An object smaller than one part is a single PUT."""

    def __init__(self, store: S3ArtifactStore, key: str, part_size: int, in_flight: int):
        from concurrent.futures import ThreadPoolExecutor

        self._store = store
        self._key = key
        self._part_size = part_size
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._upload_id: str | None = None
        self._futures: list = []
        self._slots = threading.BoundedSemaphore(in_flight)
        self._pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="s3-part")
        self._closed = False

    def _call(self, action: str, fn, **kwargs):
        try:
            return fn(Bucket=self._store.bucket, Key=self._key, **kwargs)
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._store._fail(action, exc, self._key) from exc
            raise

    def write(self, data: bytes) -> None:
        self._buffer.append(bytes(data))
        self._buffered += len(data)
        if self._buffered >= self._part_size:
            self._send_part()

    def _send_part(self) -> None:
        body = b"".join(self._buffer)
        self._buffer, self._buffered = [], 0
        if self._upload_id is None:
            created = self._call(
                "upload to",
                self._store.client.create_multipart_upload,
                ContentType="application/octet-stream",
            )
            self._upload_id = created["UploadId"]
        # Blocks while `in_flight` parts are still on their way: the sender
        # slows down to the store's pace instead of buffering without bound.
        self._slots.acquire()
        failed = next((f for f in self._futures if f.done() and f.exception()), None)
        if failed is not None:
            self._slots.release()
            failed.result()
        number = len(self._futures) + 1
        self._futures.append(self._pool.submit(self._upload_part, number, body))

    def _upload_part(self, number: int, body: bytes) -> dict:
        try:
            response = self._call(
                "upload to",
                self._store.client.upload_part,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
            return {"PartNumber": number, "ETag": response["ETag"]}
        finally:
            self._slots.release()

    def commit(self) -> None:
        try:
            if self._upload_id is None:
                self._call(
                    "upload to",
                    self._store.client.put_object,
                    Body=b"".join(self._buffer),
                    ContentType="application/octet-stream",
                )
            else:
                if self._buffered:
                    self._send_part()
                parts = [f.result() for f in self._futures]
                self._call(
                    "upload to",
                    self._store.client.complete_multipart_upload,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                )
                self._upload_id = None
        except BaseException:
            self.abort()
            raise
        finally:
            self._buffer = []
            self._pool.shutdown(wait=True)

    def abort(self) -> None:
        self._buffer = []
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                self._call(
                    "abort upload to",
                    self._store.client.abort_multipart_upload,
                    UploadId=upload_id,
                )
            except StorageError as error:
                # The bucket's lifecycle rule for incomplete uploads is the backstop.
                logger.warning("could not abort multipart upload %s: %s", upload_id, error)


class S3ArtifactStore(ArtifactStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        addressing_style: str = "auto",
        verify_tls: bool | str = True,
        multipart_chunk_mb: int = 16,
        max_concurrency: int = 4,
        connect_timeout: float = 5,
        read_timeout: float = 60,
        max_attempts: int = 5,
    ):
        from boto3.s3.transfer import TransferConfig

        if not bucket:
            raise ValueError("S3 bucket name is required")
        if multipart_chunk_mb < MIN_PART_MB:
            raise ValueError(f"multipart_chunk_mb must be at least {MIN_PART_MB}")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        # Credentials go to the client only; they are never kept on self, so they
        # cannot end up in a repr, a log line or an error page.
        self._client = make_s3_client(
            endpoint_url=endpoint_url,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            addressing_style=addressing_style,
            verify_tls=verify_tls,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_attempts=max_attempts,
        )
        chunk = multipart_chunk_mb * 1024 * 1024
        # Streamed writes hold parts in memory: smaller parts, fewer in flight.
        self._stream_part_size = min(chunk, STREAM_PART_BYTES)
        self._stream_in_flight = min(max_concurrency, STREAM_IN_FLIGHT)
        self._transfer = TransferConfig(
            multipart_threshold=chunk,
            multipart_chunksize=chunk,
            max_concurrency=max_concurrency,
            use_threads=max_concurrency > 1,
        )

    def __repr__(self) -> str:
        where = self.endpoint_url or "aws"
        return f"S3ArtifactStore(s3://{self.bucket}/{self.prefix} at {where})"

    @property
    def client(self):
        return self._client

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _full_prefix(self, prefix: str) -> str:
        _validate_prefix(prefix)
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def _fail(self, action: str, exc: BaseException, key: str | None = None) -> StorageError:
        code = _error_code(exc)
        where = f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"
        if key is not None and code in _NOT_FOUND_CODES:
            return ObjectNotFound(f"no object at {where}")
        if code == "NoSuchBucket":
            return StorageError(f"{action} {where}: bucket {self.bucket!r} does not exist")
        if code in _DENIED_CODES:
            return StorageError(f"{action} {where}: access denied ({code}); check credentials")
        return StorageError(f"{action} {where} failed: {exc}")

    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> None:
        # ChecksumSHA256 is not used: for multipart uploads S3 stores a checksum of
        # part checksums, not of the file, and moto accepts wrong values silently.
        # The digest travels as user metadata instead (x-amz-meta-sha256).
        full = self._key(key)
        os.stat(path)  # a missing source is the caller's bug: raise FileNotFoundError
        extra: dict[str, Any] = {"ContentType": "application/octet-stream"}
        if sha256:
            extra["Metadata"] = {"sha256": sha256}
        try:
            self._client.upload_file(
                str(path), self.bucket, full, ExtraArgs=extra, Config=self._transfer
            )
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._fail("upload to", exc, full) from exc
            raise

    def open_write(self, key: str) -> ArtifactWriter:
        # No sha256 metadata: the digest is only known once the last byte has
        # gone, after the multipart upload was created. The registry's database
        # holds the digest of every file.
        return _S3Writer(self, self._key(key), self._stream_part_size, self._stream_in_flight)

    def metadata(self, key: str) -> dict[str, str]:
        full = self._key(key)
        try:
            return self._client.head_object(Bucket=self.bucket, Key=full).get("Metadata", {})
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._fail("head", exc, full) from exc
            raise

    def open_read(self, key: str) -> BinaryIO:
        full = self._key(key)
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=full)["Body"]
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._fail("read", exc, full) from exc
            raise
        return io.BufferedReader(_S3Reader(body, f"s3://{self.bucket}/{full}"), COPY_BUFFER)

    def download_to(self, key: str, dest: Path) -> None:
        # s3transfer writes to a temporary name next to dest and renames at the end.
        full = self._key(key)
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._client.download_file(self.bucket, full, str(dest), Config=self._transfer)
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._fail("download", exc, full) from exc
            raise

    def exists(self, key: str) -> bool:
        # A missing bucket also answers 404 to HEAD; check() tells those apart.
        full = self._key(key)
        try:
            self._client.head_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return False
            if _is_boto_error(exc):
                raise self._fail("head", exc, full) from exc
            raise
        return True

    def _iter_objects(self, full_prefix: str):
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                yield from page.get("Contents", [])
        except Exception as exc:
            if _is_boto_error(exc):
                raise self._fail("list", exc, full_prefix) from exc
            raise

    def list_prefix(self, prefix: str) -> list[StoredObject]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        found = [
            StoredObject(obj["Key"][strip:], obj["Size"])
            for obj in self._iter_objects(self._full_prefix(prefix))
        ]
        return sorted(found, key=lambda o: o.key)

    def delete_prefix(self, prefix: str) -> None:
        full_prefix = self._full_prefix(prefix)
        batch: list[dict[str, str]] = []

        def flush() -> None:
            try:
                resp = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            except Exception as exc:
                if _is_boto_error(exc):
                    raise self._fail("delete under", exc, full_prefix) from exc
                raise
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise StorageError(
                    f"deleting under s3://{self.bucket}/{full_prefix}: "
                    f"{len(errors)} objects "
                    f"failed, first {first.get('Key')!r}: {first.get('Code')}"
                )
            batch.clear()

        for obj in self._iter_objects(full_prefix):
            batch.append({"Key": obj["Key"]})
            if len(batch) == 1000:  # DeleteObjects limit
                flush()
        if batch:
            flush()

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def check(self) -> None:
        where = self.endpoint_url or "AWS S3"
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            if not _is_boto_error(exc):
                raise
            code = _error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                msg = f"bucket {self.bucket!r} does not exist at {where}"
            elif code in _DENIED_CODES:
                msg = (
                    f"access to bucket {self.bucket!r} at {where} denied ({code}); "
                    "check credentials"
                )
            elif code:
                msg = f"bucket {self.bucket!r} at {where} answered {code}"
            else:
                msg = f"cannot reach S3 endpoint {where}: {exc}"
            raise StorageError(msg) from exc


# --------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------


def build_artifact_store(url: str, **s3_options: Any) -> ArtifactStore:
    """`file:///abs/dir`, `/abs/dir` or `s3://bucket[/prefix]`.

    `s3_options` are S3ArtifactStore keyword arguments. A local URL ignores them,
    so settings can always pass the same S3 block whichever store is configured.
    """
    if not url:
        raise ValueError("artifact store URL is empty")
    if url.startswith("s3://"):
        bucket, prefix = parse_s3_uri(url)
        return S3ArtifactStore(bucket, prefix, **s3_options)
    if url.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL must not name a host: {url!r}")
        path = unquote(parts.path)
    elif url.startswith("/"):
        path = url
    else:
        raise ValueError(
            f"artifact store URL must be file:///abs/dir, /abs/dir or s3://bucket, got {url!r}"
        )
    return LocalArtifactStore(Path(path))


# --------------------------------------------------------------------------
# Importing from a user-given S3 URI
# --------------------------------------------------------------------------

# Lenient enough for Ceph RGW and MinIO bucket names, strict enough to reject typos.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix/` -> ("bucket", "some/prefix/"). Key may be empty."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    if any(c.isspace() or ord(c) < 32 for c in uri):
        raise ValueError("S3 URI must not contain whitespace or control characters")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"S3 URI has no bucket: {uri!r}")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ValueError(f"invalid S3 bucket name {bucket!r}")
    if key.startswith("/"):
        raise ValueError(f"S3 key must not start with '/': {uri!r}")
    return bucket, key


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
        code = _error_code(exc)
        if code in ("NoSuchBucket",):
            return SourceRejected(f"bucket {bucket!r} does not exist")
        if code in _DENIED_CODES:
            return SourceRejected(f"access to {where} denied ({code})")
        return StorageError(f"{action} {where} failed: {exc}")

    def call(action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if _is_boto_error(exc):
                raise fail(action, exc) from exc
            raise

    # (key, relative name, size)
    plan: list[tuple[str, str, int]] = []
    single = None
    if key and not key.endswith("/"):
        try:
            single = client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if _error_code(exc) not in _NOT_FOUND_CODES:
                if _is_boto_error(exc):
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
