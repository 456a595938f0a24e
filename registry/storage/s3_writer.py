"""The streaming S3 writer: an object written as its bytes arrive."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from .base import ArtifactWriter, StorageError

logger = logging.getLogger(__name__)


def is_boto_error(exc: BaseException) -> bool:
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, (BotoCoreError, ClientError, Boto3Error))


class UploadTarget(Protocol):
    """What the writer needs of its store (registry.storage.s3.S3ArtifactStore),
    named here so that the writer stays below the store it serves."""

    bucket: str

    @property
    def client(self) -> Any: ...

    def storage_error(
        self, action: str, exc: BaseException, key: str | None = None
    ) -> StorageError: ...


class S3StreamWriter(ArtifactWriter):
    """A multipart upload fed as bytes arrive. Parts are uploaded by a few
    threads while the caller keeps writing; at most `in_flight` parts wait or
    travel at once, so memory stays near (in_flight + 1) x part_size whatever
    the object's size. An object smaller than one part is a single PUT."""

    def __init__(self, store: UploadTarget, key: str, part_size: int, in_flight: int):
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
            if is_boto_error(exc):
                raise self._store.storage_error(action, exc, self._key) from exc
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
