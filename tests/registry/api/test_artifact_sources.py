"""Server-side reads from S3 only where a platform admin allowed the department
to read (registry.source_policy), with that source's credentials; never from the
registry's own store. Against the moto server over HTTP."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from core.models import AuditEvent
from registry.models import AdapterVersion, ArtifactSource
from registry.services.artifact_sources import artifact_source_create
from tests.conftest import actor
from tests.factories import make_adapter
from tests.support.adapters import AdapterSpec
from tests.support.s3_server import make_bucket, s3_client

pytestmark = [pytest.mark.django_db, pytest.mark.s3]


@pytest.fixture
def training(s3_endpoint):
    """A training bucket with one run per department."""
    bucket = f"training-{uuid.uuid4().hex[:10]}"
    make_bucket(s3_endpoint, bucket)
    client = s3_client(s3_endpoint)
    for department, seed in (("legal", 31), ("finance", 32), ("legal-evil", 33)):
        for name, data in AdapterSpec(seed=seed).files().items():
            client.put_object(Bucket=bucket, Key=f"{department}/run-1/{name}", Body=data)
    return bucket


@pytest.fixture
def legal_source(root, legal, training, s3_endpoint):
    return artifact_source_create(
        actor=actor(root),
        department=legal,
        uri_prefix=f"s3://{training}/legal",
        endpoint_url=s3_endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing-secret",
    )


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


def register(client, adapter, uri):
    return client.post(f"/api/v1/adapters/{adapter.pk}/versions/", {"s3_uri": uri}, format="json")


def assert_nothing_stored(store):
    assert not AdapterVersion.objects.exists()
    assert store.list_prefix("adapters/") == []


def test_a_uri_under_the_departments_prefix_is_read_with_the_sources_settings(
    as_token, contracts, legal_source, training, s3_store, settings
):
    # The registry's own S3 settings point nowhere: only the source's endpoint works.
    settings.ARTIFACT_S3 = {**settings.ARTIFACT_S3, "endpoint_url": "http://127.0.0.1:9"}
    response = register(as_token, contracts, f"s3://{training}/legal/run-1/")
    assert response.status_code == 201, response.json()
    assert response.json()["source_uri"] == f"s3://{training}/legal/run-1/"


@pytest.mark.parametrize(
    "where,code,status",
    [
        ("finance/run-1/", "source_not_allowed", 403),  # another department's run
        ("legal-evil/run-1/", "source_not_allowed", 403),  # shares the prefix's letters
        ("legal/../finance/run-1/", "bad_s3_uri", 400),
        ("legal/./run-1/", "bad_s3_uri", 400),
        ("legal//run-1/", "bad_s3_uri", 400),
        ("legal/%2e%2e/finance/run-1/", "bad_s3_uri", 400),
    ],
)
def test_a_uri_outside_the_departments_prefixes_is_refused(
    as_token, contracts, legal_source, training, s3_store, where, code, status
):
    response = register(as_token, contracts, f"s3://{training}/{where}")
    assert response.status_code == status, response.json()
    error = response.json()["error"]
    assert error["code"] == code
    if code == "source_not_allowed":
        assert f"s3://{training}/legal/" in error["message"]  # names what is allowed
    assert_nothing_stored(s3_store)


def test_without_any_source_a_department_cannot_register_from_s3(
    as_fred, fred, finance, training, s3_store
):
    adapter = make_adapter(fred, finance, name="ledger")
    response = register(as_fred, adapter, f"s3://{training}/finance/run-1/")
    assert response.status_code == 403
    assert "allowed: none" in response.json()["error"]["message"]
    assert_nothing_stored(s3_store)


def test_the_registry_store_is_never_a_source(
    as_root, as_token, root, legal, contracts, s3_store, training, s3_endpoint
):
    bucket = s3_store.bucket
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="registry/adapters/x/a.json", Body=b"{}")
    # Even a source that names the whole bucket cannot be made...
    made = as_root.post(
        "/api/v1/artifact-sources/",
        {"department": "legal", "uri_prefix": f"s3://{bucket}/"},
        format="json",
    )
    assert made.status_code == 400 and made.json()["error"]["code"] == "source_is_registry_store"
    # ...and one inserted behind the service's back is still not used.
    ArtifactSource.objects.create(department=legal, uri_prefix=f"s3://{bucket}/")
    response = register(as_token, contracts, f"s3://{bucket}/registry/adapters/x/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "source_is_registry_store"
    assert not AdapterVersion.objects.exists()


def test_only_platform_admins_manage_sources_and_the_secret_is_kept_encrypted(
    as_root, as_lena, as_token, legal, training, s3_endpoint
):
    body = {
        "department": "legal",
        "uri_prefix": f"s3://{training}/legal",
        "access_key_id": "AKIAEXAMPLE",
        "secret_access_key": "very-secret-key",
    }
    for client in (as_lena, as_token):
        assert client.post("/api/v1/artifact-sources/", body, format="json").status_code == 403
        assert client.get("/api/v1/artifact-sources/").status_code == 403

    created = as_root.post("/api/v1/artifact-sources/", body, format="json")

    assert created.status_code == 201, created.json()
    assert created.json()["uri_prefix"] == f"s3://{training}/legal/"
    assert created.json()["has_secret"] is True
    assert "very-secret-key" not in created.content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret_access_key FROM registry_artifactsource")
        (stored,) = cursor.fetchone()
    assert stored.startswith("fernet:") and "very-secret-key" not in stored
    event = AuditEvent.objects.get(action="artifact_source.created")
    assert "very-secret-key" not in str(event.details)
    source_id = created.json()["id"]
    changed = as_root.patch(
        f"/api/v1/artifact-sources/{source_id}/", {"region": "eu-west-1"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["region"] == "eu-west-1"
    assert as_root.delete(f"/api/v1/artifact-sources/{source_id}/").status_code == 204
    assert list(
        AuditEvent.objects.filter(action__startswith="artifact_source.").values_list(
            "action", flat=True
        )
    ) == ["artifact_source.deleted", "artifact_source.updated", "artifact_source.created"]
