"""Retention of archived versions' artifacts, per department
(Department.artifact_retention_days): once a version has been archived for that
long, its files are deleted from the artifact store and the deletion is audited.
The row stays, with its hashes and lineage: the history of what was served is kept,
only the bytes go.

Only archived versions qualify; a version is archived only after it was deprecated,
which retires it from every deployment. Staged copies on adapter volumes are the
volume GC's (serving/volume.py), which keeps whatever a manifest, a rollout or a
served adapter still names.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import CharField, OuterRef, Subquery
from django.db.models.functions import Cast
from django.utils import timezone

from core.audit import audit_record
from core.models import AuditEvent
from registry.artifact_store import get_artifact_store
from registry.models import AdapterVersion, VersionStatus
from registry.storage.base import StorageError

logger = logging.getLogger(__name__)
BATCH = 100


def versions_due_for_artifact_deletion(now=None) -> list[AdapterVersion]:
    """Archived versions whose department's retention has run out since archiving.
    When a version was archived is read from its audit event: the one record of it."""
    now = now or timezone.now()
    archived_at = (
        AuditEvent.objects.filter(
            action="version.archive",
            object_type=AdapterVersion._meta.label_lower,
            object_id=Cast(OuterRef("pk"), CharField()),
        )
        .order_by("-created_at")
        .values("created_at")[:1]
    )
    candidates = (
        AdapterVersion.objects.filter(
            status=VersionStatus.ARCHIVED,
            artifacts_deleted_at__isnull=True,
            adapter__department__artifact_retention_days__isnull=False,
        )
        .annotate(archived_at=Subquery(archived_at))
        .filter(archived_at__isnull=False)
        .select_related("adapter__department")
        .order_by("archived_at")
    )
    due: list[AdapterVersion] = []
    for version in candidates.iterator(chunk_size=BATCH):
        days = version.adapter.department.artifact_retention_days
        assert days is not None  # the filter above
        if version.archived_at <= now - timedelta(days=days):
            due.append(version)
            if len(due) >= BATCH:
                break
    return due


def version_artifacts_delete(*, version: AdapterVersion, now=None) -> bool:
    """Deletes one archived version's files from the store, then marks the row with a
    compare-and-swap, so two workers audit it once. A crash between the two only
    deletes again next time (deleting a prefix is idempotent)."""
    now = now or timezone.now()
    try:
        get_artifact_store().delete_prefix(version.storage_prefix)
    except StorageError as error:
        logger.warning("retention: version %s not deleted yet: %s", version.pk, error)
        return False
    marked = AdapterVersion.objects.filter(
        pk=version.pk, status=VersionStatus.ARCHIVED, artifacts_deleted_at__isnull=True
    ).update(artifacts_deleted_at=now)
    if marked:
        department = version.adapter.department
        audit_record(
            actor=None,
            action="version.artifacts_deleted",
            obj=version,
            department=department,
            comment=(
                f"Archived for more than {department.artifact_retention_days} days "
                f"(the retention of {department.slug}): its artifact files were deleted."
            ),
            details={
                "storage_prefix": version.storage_prefix,
                "files": len(version.files or []),
                "total_size": version.total_size,
            },
        )
    return bool(marked)


def retention_apply(now=None) -> int:
    """The housekeeping pass: deletes what is due; returns how many versions."""
    return sum(
        version_artifacts_delete(version=version, now=now)
        for version in versions_due_for_artifact_deletion(now)
    )
