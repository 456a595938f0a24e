"""Builders for rows that tests need. Versions are made through the real
ingest service, so every version in a test went through validation."""

from __future__ import annotations

import itertools

from django.core.files.uploadedfile import SimpleUploadedFile

from registry.ingest.incoming import UploadedFiles
from registry.models import Adapter, AdapterVersion
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
