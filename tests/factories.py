"""Builders for rows that tests need. Versions are made through the real
ingest service, so every version in a test went through validation."""

from __future__ import annotations

import itertools

from django.core.files.uploadedfile import SimpleUploadedFile

from registry.ingest.incoming import UploadedFiles
from registry.models import Adapter, AdapterVersion, VersionStatus
from registry.services.adapters import adapter_create
from registry.services.versions import version_register, version_transition
from tests.conftest import actor
from tests.support.adapters import AdapterSpec, adapter_tar_gz

_seeds = itertools.count(1000)


def make_adapter(user, department, name="contracts", **extra) -> Adapter:
    extra.setdefault("base_model", "tiny-llama")
    return adapter_create(actor=actor(user), department=department, name=name, **extra)


def archive_upload(spec: AdapterSpec | None = None, name="adapter.tar.gz") -> SimpleUploadedFile:
    spec = spec or AdapterSpec(seed=next(_seeds))
    return SimpleUploadedFile(name, adapter_tar_gz(spec), content_type="application/gzip")


def make_version(user, adapter, spec: AdapterSpec | None = None, **extra) -> AdapterVersion:
    result = version_register(
        actor=actor(user), adapter=adapter, source=UploadedFiles([archive_upload(spec)]), **extra
    )
    return result.version


def make_approved_version(author, approver, adapter, spec=None) -> AdapterVersion:
    version = make_version(author, adapter, spec)
    version_transition(actor=actor(author), version=version, action="submit")
    return version_transition(actor=actor(approver), version=version, action="approve")


def make_approved_versions_bulk(
    author, approver, department, specs: list[AdapterSpec], *, prefix: str
) -> list[AdapterVersion]:
    """One approved version each of len(specs) new adapters named `<prefix>NNN`
    (served as `<department slug>-<prefix>NNN`), for tests about hundreds of
    adapters: each version's files go through the real ingest (validated,
    stored: its own weights), while the adapters and the approvals are written
    in bulk (their own services are tested in tests/registry)."""
    from django.utils import timezone

    adapters = Adapter.objects.bulk_create(
        Adapter(
            department=department,
            name=f"{prefix}{i:03d}",
            served_name=f"{department.slug}-{prefix}{i:03d}",
            base_model="tiny-llama",
            created_by=author,
        )
        for i in range(len(specs))
    )
    Adapter.owners.through.objects.bulk_create(
        Adapter.owners.through(adapter_id=a.pk, user_id=author.pk) for a in adapters
    )
    versions = [make_version(author, a, spec) for a, spec in zip(adapters, specs, strict=True)]
    AdapterVersion.objects.filter(pk__in=[v.pk for v in versions]).update(
        status=VersionStatus.APPROVED,
        submitted_by=author,
        reviewed_by=approver,
        reviewed_at=timezone.now(),
    )
    return list(
        AdapterVersion.objects.filter(pk__in=[v.pk for v in versions])
        .select_related("adapter")
        .order_by("adapter__name")
    )
