"""The configured artifact store, built once per process from settings."""

from __future__ import annotations

import logging
from functools import cache

from django.conf import settings

from core.errors import DependencyUnavailable
from registry.storage import ArtifactStore, StorageError, build_artifact_store

logger = logging.getLogger(__name__)


@cache
def get_artifact_store() -> ArtifactStore:
    return build_artifact_store(settings.ARTIFACT_STORE_URL, **settings.ARTIFACT_S3)


def discard_stored(store: ArtifactStore, prefix: str) -> None:
    """Deletes what a failed registration wrote. A store that is down cannot
    delete either; that must not replace the caller's own error."""
    try:
        store.delete_prefix(prefix.rstrip("/") + "/")
    except StorageError as error:
        logger.warning("could not delete objects under %s: %s", prefix, error)


def store_unavailable(error: StorageError) -> DependencyUnavailable:
    logger.warning("artifact store write failed: %s", error)
    return DependencyUnavailable(
        "The artifact store is unavailable; nothing was registered. Try again.",
        code="artifact_store_unavailable",
    )
