"""The artifact store on any S3-compatible bucket (AWS, MinIO, Ceph RGW)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from .base import (
    COPY_BUFFER,
    ArtifactStore,
    ArtifactWriter,
    ObjectNotFound,
    StorageError,
    StoredObject,
    validate_key,
    validate_prefix,
)
from .s3_writer import S3StreamWriter, is_boto_error

# S3 rejects multipart parts below 5 MiB (except the last one).
MIN_PART_MB = 5
STREAM_PART_BYTES = 8 * 1024 * 1024
STREAM_IN_FLIGHT = 3

NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
DENIED_CODES = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


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


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


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
            if is_boto_error(exc) or isinstance(exc, OSError):
                raise StorageError(f"reading {self._where} failed: {exc}") from exc
            raise
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


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
        validate_prefix(prefix)
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def storage_error(
        self, action: str, exc: BaseException, key: str | None = None
    ) -> StorageError:
        code = error_code(exc)
        where = f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"
        if key is not None and code in NOT_FOUND_CODES:
            return ObjectNotFound(f"no object at {where}")
        if code == "NoSuchBucket":
            return StorageError(f"{action} {where}: bucket {self.bucket!r} does not exist")
        if code in DENIED_CODES:
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
            if is_boto_error(exc):
                raise self.storage_error("upload to", exc, full) from exc
            raise

    def open_write(self, key: str) -> ArtifactWriter:
        # No sha256 metadata: the digest is only known once the last byte has
        # gone, after the multipart upload was created. The registry's database
        # holds the digest of every file.
        return S3StreamWriter(self, self._key(key), self._stream_part_size, self._stream_in_flight)

    def metadata(self, key: str) -> dict[str, str]:
        full = self._key(key)
        try:
            return self._client.head_object(Bucket=self.bucket, Key=full).get("Metadata", {})
        except Exception as exc:
            if is_boto_error(exc):
                raise self.storage_error("head", exc, full) from exc
            raise

    def open_read(self, key: str) -> BinaryIO:
        full = self._key(key)
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=full)["Body"]
        except Exception as exc:
            if is_boto_error(exc):
                raise self.storage_error("read", exc, full) from exc
            raise
        return io.BufferedReader(_S3Reader(body, f"s3://{self.bucket}/{full}"), COPY_BUFFER)

    def download_to(self, key: str, dest: Path) -> None:
        # s3transfer writes to a temporary name next to dest and renames at the end.
        full = self._key(key)
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._client.download_file(self.bucket, full, str(dest), Config=self._transfer)
        except Exception as exc:
            if is_boto_error(exc):
                raise self.storage_error("download", exc, full) from exc
            raise

    def exists(self, key: str) -> bool:
        # A missing bucket also answers 404 to HEAD; check() tells those apart.
        full = self._key(key)
        try:
            self._client.head_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                return False
            if is_boto_error(exc):
                raise self.storage_error("head", exc, full) from exc
            raise
        return True

    def _iter_objects(self, full_prefix: str):
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                yield from page.get("Contents", [])
        except Exception as exc:
            if is_boto_error(exc):
                raise self.storage_error("list", exc, full_prefix) from exc
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
                if is_boto_error(exc):
                    raise self.storage_error("delete under", exc, full_prefix) from exc
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
            if not is_boto_error(exc):
                raise
            code = error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                msg = f"bucket {self.bucket!r} does not exist at {where}"
            elif code in DENIED_CODES:
                msg = (
                    f"access to bucket {self.bucket!r} at {where} denied ({code}); "
                    "check credentials"
                )
            elif code:
                msg = f"bucket {self.bucket!r} at {where} answered {code}"
            else:
                msg = f"cannot reach S3 endpoint {where}: {exc}"
            raise StorageError(msg) from exc


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
