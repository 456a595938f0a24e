"""The configured artifact store, built once per process from settings."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from registry.storage import ArtifactStore, build_artifact_store


@cache
def get_artifact_store() -> ArtifactStore:
    return build_artifact_store(settings.ARTIFACT_STORE_URL, **settings.ARTIFACT_S3)


def s3_source_options() -> dict:
    """Credentials and endpoint used to read user-given s3:// URIs."""
    return dict(settings.ARTIFACT_S3)
