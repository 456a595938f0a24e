"""The digest an Idempotency-Key is bound to: sha256 over the method, the path
and the content of the request (each file part's name and sha256, the other
form fields, or the JSON payload), as payment APIs bind theirs. Multipart
boundaries and part order of the form fields do not count; file bytes do.

File parts are hashed by an upload handler while Django parses the body, so
nothing is read twice: in front of the streaming ingest handler for the request
that holds the key, or alone (keeping no bytes at all) for a request that only
needs to compare itself with the one holding it.
"""

from __future__ import annotations

import hashlib
import io
import json

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from core.body_limit import insert_upload_handler


class _Hashed(UploadedFile):
    """request.FILES' entry for a part that was only hashed: no bytes kept."""

    def __init__(self, name: str, size: int):
        super().__init__(io.BytesIO(), name=name, size=size)


class RequestDigestHandler(FileUploadHandler):
    """Hashes every file part. `keep=False` swallows the bytes as well."""

    chunk_size = 64 * 1024

    def __init__(self, request, *, keep: bool):
        super().__init__(request)
        self.keep = keep
        self.parts: list[tuple[str, str, int, str]] = []
        self._hash = None
        self._size = 0

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        self._hash, self._size = hashlib.sha256(), 0
        if not self.keep:
            raise StopFutureHandlers

    def receive_data_chunk(self, raw_data, start):
        self._hash.update(raw_data)
        self._size += len(raw_data)
        return raw_data if self.keep else None

    def file_complete(self, file_size):
        name = self.file_name or ""
        self.parts.append((self.field_name, name, self._size, self._hash.hexdigest()))
        return None if self.keep else _Hashed(name, self._size)


def install_digest_handler(request, *, keep: bool) -> RequestDigestHandler | None:
    """Put the handler right after the body-size guard. None when the body is
    not multipart or was already parsed (the digest then reads request.FILES)."""
    django_request = getattr(request, "_request", request)
    if not django_request.content_type.startswith("multipart/form-data"):
        return None
    if hasattr(django_request, "_files"):
        return None
    handler = RequestDigestHandler(django_request, keep=keep)
    return handler if insert_upload_handler(django_request, handler) else None


def _file_parts(request) -> list[tuple[str, str, int, str]]:
    parts = []
    for field_name, uploads in request.FILES.lists():
        for upload in uploads:
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            parts.append((field_name, upload.name, upload.size, digest.hexdigest()))
    return parts


def request_digest(request, handler: RequestDigestHandler | None) -> str:
    """Call after the body was parsed (request.data touched)."""
    django_request = getattr(request, "_request", request)
    if django_request.content_type.startswith("multipart/form-data"):
        files = handler.parts if handler is not None else _file_parts(django_request)
        fields = {name: sorted(values) for name, values in django_request.POST.lists()}
        content = {"files": [list(part) for part in files], "fields": fields}
    else:
        content = {"json": request.data}
    canonical = json.dumps(
        {"method": request.method, "path": request.path, "content": content},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
