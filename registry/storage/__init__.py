"""Where adapter artifacts live: a local directory or any S3-compatible bucket.

One module per concern: `base` (the store interface, key rules, errors),
`local`, `s3` and `s3_writer` (the streaming multipart writer). Nothing here
imports Django: `build_artifact_store` takes plain values and the settings
module decides what they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import (
    COPY_BUFFER,
    ArtifactStore,
    ArtifactWriter,
    ObjectNotFound,
    StorageError,
    StoredObject,
    validate_key,
)
from .local import LocalArtifactStore
from .s3 import S3ArtifactStore, make_s3_client, parse_s3_uri

__all__ = [
    "COPY_BUFFER",
    "ArtifactStore",
    "ArtifactWriter",
    "LocalArtifactStore",
    "ObjectNotFound",
    "S3ArtifactStore",
    "StorageError",
    "StoredObject",
    "build_artifact_store",
    "make_s3_client",
    "parse_s3_uri",
    "validate_key",
]


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
