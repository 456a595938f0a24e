"""Helpers for page tests: the cast signed in through Django's test client, the
adapter most page tests look at, and builders for large data sets used to
prove query counts stay flat."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent
from registry.models import Adapter, AdapterVersion


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# Page tests import these two into their conftest (tests/registry/web, tests/serving/web).
@pytest.fixture
def contracts(lena, legal):
    from tests.factories import make_adapter  # it imports tests.conftest, which imports this

    return make_adapter(lena, legal, name="contracts", description="Contract clause review.")


@pytest.fixture
def v1(lena, contracts):
    from tests.factories import make_version

    return make_version(lena, contracts)


def query_count(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return len(captured.captured_queries)


def clone_versions(template: AdapterVersion, adapter: Adapter, count: int, status: str, user=None):
    """Rows that look like real versions without running ingest N times."""
    adapter.refresh_from_db(fields=["last_version_number"])
    start = adapter.last_version_number
    fields = {
        f.name: getattr(template, f.name)
        for f in AdapterVersion._meta.concrete_fields
        if f.name not in {"id", "adapter", "number", "manifest_sha256", "status", "idempotency_key"}
    }
    if user is not None:
        fields["registered_by"] = user
    rows = [
        AdapterVersion(
            **fields,
            adapter=adapter,
            number=start + i + 1,
            manifest_sha256=f"{adapter.pk:08d}{start + i + 1:056d}",
            status=status,
        )
        for i in range(count)
    ]
    AdapterVersion.objects.bulk_create(rows)
    Adapter.objects.filter(pk=adapter.pk).update(last_version_number=start + count)
    adapter.last_version_number = start + count
    return rows


def bulk_adapters(department, owner, count: int, prefix="bulk") -> list[Adapter]:
    adapters = Adapter.objects.bulk_create(
        Adapter(
            department=department,
            name=f"{prefix}-{i}",
            served_name=f"{department.slug}-{prefix}-{i}",
            base_model="tiny-llama",
            created_by=owner,
        )
        for i in range(count)
    )
    Adapter.owners.through.objects.bulk_create(
        Adapter.owners.through(adapter_id=a.pk, user_id=owner.pk) for a in adapters
    )
    return adapters


def bulk_events(department, user, count: int, obj_type: str, obj_id: str) -> None:
    for i in range(count):
        AuditEvent.objects.create(
            actor=user,
            actor_label=user.get_username(),
            action="version.noted",
            department=department,
            object_type=obj_type,
            object_id=obj_id,
            object_repr=f"event {i}",
        )
