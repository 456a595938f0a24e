"""The one function every string shown to a member or a token passes through.

Error texts from boto3, httpx, the filesystem and vLLM name the machinery:
endpoints, hosts and ports, bucket names, volume and staging paths. A member
needs to know *what* failed, not *where* it runs, and an attacker probing from
a member account learns the internal network from exactly these strings. So:

- the configured places are replaced by name first (the artifact store's
  endpoint and bucket, the MLflow server, the staging and var folders), since
  a bucket name alone matches no pattern;
- then URLs, absolute paths, host:port pairs, IP addresses and internal host
  names, by pattern.

Platform admins see the unredacted text (pages, API and logs); nothing is
changed in the database.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from django.conf import settings

URL = "[url]"
PATH = "[path]"
HOST = "[host]"
BUCKET = "[bucket]"

_PATTERNS = [
    # scheme://anything-up-to-whitespace-or-quote (s3://bucket/key, http://10.0.0.5:9000/x)
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>)\]]*", re.IGNORECASE), URL),
    # /an/absolute/path with at least two parts (not "a/relative/file" in an artifact)
    (re.compile(r"(?<![\w.~-])/(?:[\w.@%+~-]+/)+[\w.@%+~-]*"), PATH),
    # IPv4, with or without a port
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b"), HOST),
    # host names a cluster or a company uses, with or without a port
    (
        re.compile(
            r"\b(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
            r"(?:local|localdomain|internal|svc|cluster|lan|corp|intranet|com|net|org|io|"
            r"cloud|dev)\b(?::\d{1,5})?",
            re.IGNORECASE,
        ),
        HOST,
    ),
    (re.compile(r"\blocalhost(?::\d{1,5})?\b", re.IGNORECASE), HOST),
    # name:port (a host name without dots, e.g. a compose service "minio:9000")
    (re.compile(r"\b[a-z][a-z0-9-]{0,62}:\d{2,5}\b", re.IGNORECASE), HOST),
]


def _configured_places() -> list[tuple[str, str]]:
    """(text, replacement) for the places settings name, longest first."""
    places: list[tuple[str, str]] = []
    store = getattr(settings, "ARTIFACT_STORE_URL", "") or ""
    if store.startswith("s3://"):
        bucket = urlsplit(store).netloc
        if bucket:
            places.append((bucket, BUCKET))
    s3 = getattr(settings, "ARTIFACT_S3", {}) or {}
    for url in (s3.get("endpoint_url"), getattr(settings, "MLFLOW_TRACKING_URI", "")):
        if url:
            places.append((str(url).rstrip("/"), URL))
            netloc = urlsplit(str(url)).netloc
            if netloc:
                places.append((netloc, HOST))
    for folder in (
        getattr(settings, "INGEST_STAGING_DIR", None),
        getattr(settings, "VAR_DIR", None),
    ):
        if folder:
            places.append((str(folder), PATH))
    # Longest first, so that a URL goes before the host inside it.
    return sorted({p for p in places if len(p[0]) >= 3}, key=lambda p: -len(p[0]))


def redact(text: str | None) -> str:
    """`text` without hosts, ports, paths, bucket names and endpoints."""
    if not text:
        return text or ""
    for place, replacement in _configured_places():
        text = text.replace(place, replacement)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
