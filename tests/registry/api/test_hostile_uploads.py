"""The hostile corpus through the HTTP API: each artifact gets its 4xx with the
corpus' code in the one error format, and nothing is left behind (no row, no
stored object, no staging folder, no number used)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings as django_settings

from core.models import AuditEvent
from registry.artifact_store import get_artifact_store
from registry.ingest.staging import IngestLimits
from registry.models import AdapterVersion
from tests.factories import make_adapter
from tests.registry.ingest.hostile_corpus import HOSTILE_ARTIFACTS

pytestmark = pytest.mark.django_db

DEFAULT_LIMITS = IngestLimits()

# Where the HTTP layer legitimately answers differently from the ingest library,
# with the reason. Anything not listed must match the corpus exactly.
HTTP_CODES = {
    # A request with no file part at all is indistinguishable from a JSON body
    # without s3_uri; the API says "give the artifact one way".
    "no_files": ("no_artifact", 400),
    # Django's multipart parser drops a part whose filename is "..", so the
    # request arrives without it and fails for the missing weights instead.
    "loose_traversal_name": ("missing_weights", 400),
    # The zip stores its files uncompressed, so the body itself passes
    # INGEST_MAX_BYTES: core.body_limit cuts it off before the archive is opened.
    "over_file_size": ("request_too_large", 413),
}


def _apply_limits(artifact, settings, monkeypatch) -> None:
    """Apply the entry's limits through the settings where a setting expresses
    them; otherwise hand the corpus' limits to the request path directly."""
    limits = artifact.limits
    if limits.max_compression_ratio != DEFAULT_LIMITS.max_compression_ratio:
        raise AssertionError("max_compression_ratio has no setting: add one or patch it here")
    if limits.max_entries != DEFAULT_LIMITS.max_entries:
        settings.INGEST_MAX_ENTRIES = limits.max_entries
    total, per_file = limits.max_total_bytes, limits.max_file_bytes
    if total != DEFAULT_LIMITS.max_total_bytes and total != per_file:
        # INGEST_MAX_BYTES sets the total and the per-file limit at once, so a
        # total-only limit has no setting (the per-file one would fire first).
        # Where the API and the registration service read their limits, they get
        # the corpus' own, so the 413 for the total is still checked end to end.
        for module in ("registry.api.views", "registry.services.versions"):
            monkeypatch.setattr(f"{module}.ingest_limits", lambda: limits)
        return
    if per_file != DEFAULT_LIMITS.max_file_bytes:
        settings.INGEST_MAX_BYTES = per_file


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


BOUNDARY = "hostile-boundary-7d1e"


def multipart_body(upload) -> bytes:
    """Raw multipart, so that filenames reach the server exactly as a hostile
    client would send them (Django's test encoder refuses some)."""
    parts = []
    for name, data in upload:
        parts.append(
            f"--{BOUNDARY}\r\n"
            f'Content-Disposition: form-data; name="files"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    if not upload:
        parts.append(
            f"--{BOUNDARY}\r\n"
            'Content-Disposition: form-data; name="dataset"\r\n\r\nnone\r\n'.encode()
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def _post(client, adapter, upload):
    return client.generic(
        "POST",
        f"/api/v1/adapters/{adapter.pk}/versions/",
        multipart_body(upload),
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
    )


def _assert_nothing_left(adapter, store):
    adapter.refresh_from_db()
    assert adapter.last_version_number == 0
    assert not AdapterVersion.objects.filter(adapter=adapter).exists()
    assert not AuditEvent.objects.filter(action="version.registered").exists()
    assert store.list_prefix("adapters/") == []
    staging = Path(django_settings.INGEST_STAGING_DIR)
    assert not staging.exists() or list(staging.iterdir()) == []


def _check(artifact, client, adapter, settings, monkeypatch):
    _apply_limits(artifact, settings, monkeypatch)
    response = _post(client, adapter, artifact.build())

    code, status = HTTP_CODES.get(artifact.name, (artifact.expected_code, artifact.expected_status))
    body = response.json()
    assert response.status_code == status, body
    assert set(body) == {"error"}
    error = body["error"]
    assert (error["status"], error["code"]) == (status, code), error
    assert error["message"]
    assert error["request_id"]
    _assert_nothing_left(adapter, get_artifact_store())


@pytest.mark.parametrize("artifact", HOSTILE_ARTIFACTS, ids=lambda a: a.name)
def test_hostile_upload_is_refused_and_leaves_nothing(
    artifact, as_lena, contracts, settings, monkeypatch
):
    _check(artifact, as_lena, contracts, settings, monkeypatch)


@pytest.mark.s3
@pytest.mark.parametrize("artifact", HOSTILE_ARTIFACTS, ids=lambda a: a.name)
def test_hostile_upload_leaves_nothing_in_s3(
    artifact, as_token, contracts, settings, monkeypatch, s3_store
):
    _check(artifact, as_token, contracts, settings, monkeypatch)
    assert s3_store.list_prefix("adapters/") == []


def test_a_valid_upload_after_the_corpus_still_gets_number_one(as_lena, contracts):
    from tests.factories import archive_upload

    for artifact in HOSTILE_ARTIFACTS[:5]:
        assert _post(as_lena, contracts, artifact.build()).status_code >= 400
    response = as_lena.post(
        f"/api/v1/adapters/{contracts.pk}/versions/",
        {"files": [archive_upload()]},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["number"] == 1
