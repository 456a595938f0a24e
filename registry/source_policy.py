"""Which locations the server itself may read artifacts from, on a department's behalf.

A registration from `s3_uri`, or from an MLflow run, makes the registry fetch
bytes with its own network position and (by default) its own credentials. So
a member could otherwise name another department's stored artifact, or
anything else those credentials reach. The rules:

- S3: the location must fall under one of the department's ArtifactSource
  prefixes (set by platform admins), compared on the normalized bucket and
  key, segment by segment; it is read with that source's credentials. The
  registry's own store is never a source.
- MLflow run artifacts: `mlflow-artifacts:` through the configured tracking
  server only (a host in the URI must be that server's),
  `s3:` as above, http(s) on the configured tracking server itself, or `file:`
  under MLFLOW_FILE_ARTIFACT_ROOTS. Anything else is refused.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from django.conf import settings

from core.errors import NotAuthorized, ValidationFailed
from core.models import Department
from registry.models import ArtifactSource
from registry.storage import parse_s3_uri

# normalize_s3_uri's rules as one regular expression, for the OpenAPI schema: a
# bucket S3 accepts (3-63 of a-z 0-9 . _ -, no ".."), then a key of segments that
# are not empty, "." or "..", without "%", whitespace or control characters.
_CHAR, _NOT_DOT = r"[^/%\s\x00-\x1f]", r"[^/%\s\x00-\x1f.]"
_SEGMENT = rf"(?:{_NOT_DOT}{_CHAR}*|\.{_NOT_DOT}{_CHAR}*|\.\.{_CHAR}+)"
S3_URI_PATTERN = (
    r"^s3://(?![^/]*\.\.)[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"
    rf"(?:/(?:{_SEGMENT}/)*{_SEGMENT}?)?$"
)


class SourceNotAllowed(NotAuthorized):
    code = "source_not_allowed"
    public = True  # names the caller's URI and their department's own prefixes


def normalize_s3_uri(uri: str, *, folder: bool = False) -> str:
    """`s3://bucket/key` with every segment checked: no `.`/`..`, no empty
    segment (`a//b`), no percent-encoding tricks. Some S3-compatible servers
    normalize such keys, so they would name another object than the one checked.
    `folder=True` adds the trailing '/' a prefix needs (`legal/` never matches `legal-x/`)."""
    try:
        bucket, key = parse_s3_uri(uri)
    except ValueError as error:
        raise ValidationFailed(str(error), code="bad_s3_uri") from None
    if "%" in key:
        raise ValidationFailed(
            f"S3 URI {uri!r} must not contain percent-encoded characters.", code="bad_s3_uri"
        )
    segments = key.split("/")
    trailing = key.endswith("/")
    body = segments[:-1] if trailing else segments
    if key and any(part in ("", ".", "..") for part in body):
        raise ValidationFailed(
            f"S3 URI {uri!r} has an empty, '.' or '..' path segment.", code="bad_s3_uri"
        )
    if folder and key and not trailing:
        key += "/"
    return f"s3://{bucket}/{key}"


def _under(uri: str, prefix: str) -> bool:
    return uri == prefix or uri.startswith(prefix if prefix.endswith("/") else prefix + "/")


def registry_store_prefix() -> str | None:
    store = settings.ARTIFACT_STORE_URL
    if not store.startswith("s3://"):
        return None
    return normalize_s3_uri(store, folder=True)


def overlaps_registry_store(uri: str) -> bool:
    """Either contains the other: a source prefix above the store would reach it too."""
    store = registry_store_prefix()
    return store is not None and (_under(uri, store) or _under(store, uri))


def source_for_s3_uri(department: Department, uri: str) -> ArtifactSource:
    """The department's source that allows reading `uri`, or a 4xx naming the rule."""
    normalized = normalize_s3_uri(uri)
    if overlaps_registry_store(normalized):
        raise SourceNotAllowed(
            f"{uri} is in the registry's own artifact store, which is never a source: "
            "register a version from where training wrote it.",
            code="source_is_registry_store",
        )
    sources = sorted(
        ArtifactSource.objects.filter(department=department),
        key=lambda s: len(s.uri_prefix),
        reverse=True,
    )
    for source in sources:
        if _under(normalized, source.uri_prefix):
            return source
    allowed = ", ".join(s.uri_prefix for s in sources) or "none"
    raise SourceNotAllowed(
        f"{uri} is not under any S3 prefix {department.name} may register from "
        f"(allowed: {allowed}). A platform admin adds allowed prefixes (artifact sources).",
        details={"allowed_prefixes": [s.uri_prefix for s in sources]},
    )


def s3_options_for(source: ArtifactSource) -> dict:
    """The registry's S3 settings, with the source's own endpoint and keys where given."""
    options = dict(settings.ARTIFACT_S3)
    if source.endpoint_url:
        options["endpoint_url"] = source.endpoint_url
    if source.region:
        options["region"] = source.region
    if source.access_key_id:
        options["access_key"] = source.access_key_id
        options["secret_key"] = source.secret_access_key
        options.pop("session_token", None)
    return options


def require_mlflow_artifact_location(
    department: Department, artifact_uri: str, artifact_path: str
) -> None:
    """Refuses a run whose artifacts live where the registry must not read for
    this department. Called before anything is listed or downloaded."""
    location = artifact_uri.rstrip("/") + "/" + artifact_path.strip("/")
    scheme = urlsplit(artifact_uri).scheme.lower()
    if scheme == "mlflow-artifacts":
        # `mlflow-artifacts:/1/...` goes through the tracking server; a host in
        # the URI (`mlflow-artifacts://host:port/...`) would send the registry's
        # MLflow credentials there, so it must be the tracking server itself.
        host = urlsplit(artifact_uri).netloc
        tracking = urlsplit(settings.MLFLOW_TRACKING_URI).netloc
        if host and host != tracking:
            raise SourceNotAllowed(
                f"The run's artifacts are proxied by {host}, not by the configured MLflow "
                "tracking server; the registry reads mlflow-artifacts: only through the "
                "tracking server itself.",
                code="mlflow_artifact_location_not_allowed",
            )
        return
    if scheme == "s3":
        source_for_s3_uri(department, location)
        return
    if scheme in ("http", "https"):
        tracking = urlsplit(settings.MLFLOW_TRACKING_URI)
        given = urlsplit(artifact_uri)
        if (given.scheme, given.netloc) == (tracking.scheme, tracking.netloc):
            return
        raise SourceNotAllowed(
            f"The run's artifacts are at {given.scheme}://{given.netloc}, not on the "
            "configured MLflow tracking server; the registry only fetches http(s) "
            "artifacts from the tracking server itself.",
            code="mlflow_artifact_location_not_allowed",
        )
    if scheme in ("file", ""):
        path = unquote(urlsplit(location).path) if scheme else location
        real = os.path.realpath(path)
        for root in settings.MLFLOW_FILE_ARTIFACT_ROOTS:
            if os.path.commonpath([real, root]) == root:
                return
        roots = ", ".join(settings.MLFLOW_FILE_ARTIFACT_ROOTS) or "none configured"
        raise SourceNotAllowed(
            f"The run's artifacts are on the registry host's disk ({artifact_uri}); file: "
            f"artifact locations are only read under MLFLOW_FILE_ARTIFACT_ROOTS ({roots}).",
            code="mlflow_artifact_location_not_allowed",
        )
    raise SourceNotAllowed(
        f"The run's artifact location {artifact_uri} uses {scheme}:, which the registry "
        "does not read; use mlflow-artifacts:, s3: (an allowed prefix) or the tracking server.",
        code="mlflow_artifact_location_not_allowed",
    )
