"""Bodies larger than the ingest limit are refused with 413 before they cost
anything: a declared Content-Length before one byte is read, and file parts the
moment they pass the limit (core.body_limit)."""

from __future__ import annotations

import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.models import AdapterVersion
from tests.factories import make_adapter
from tests.support.adapters import AdapterSpec, tar_gz_bytes

pytestmark = pytest.mark.django_db

LIMIT = 64 * 1024
MULTIPART = "multipart/form-data; boundary=xyz"


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.INGEST_MAX_BYTES = LIMIT
    settings.INGEST_MULTIPART_ALLOWANCE_BYTES = 16 * 1024


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(as_token, contracts):
    # The test client's body is 9 bytes: reading past them fails the request
    # ("Cannot read more than the available bytes"), so a 413 proves nothing was read.
    response = as_token.post(
        f"/api/v1/adapters/{contracts.pk}/versions/",
        data=b"--xyz--\r\n",
        content_type=MULTIPART,
        CONTENT_LENGTH=str(10 * 1024**3),
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "INGEST_MAX_BYTES" in error["message"]
    # No Connection header: the server closes (tests/core/test_body_limit_over_http.py).
    assert not response.has_header("Connection")
    assert not AdapterVersion.objects.exists()


@pytest.mark.parametrize("caller", ["as_lena", "as_token"])
def test_a_json_body_past_the_small_limit_is_413_before_it_is_read_even_for_members(
    request, settings, contracts, caller
):
    # As shipped: multipart files may take 2 GiB; a JSON body is read into memory whole.
    settings.INGEST_MAX_BYTES = 2 * 1024**3
    declared = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    # As above: reading past the 2 bytes fails the request, so a 413 proves none was read.
    response = request.getfixturevalue(caller).post(
        f"/api/v1/adapters/{contracts.pk}/versions/",
        data=b"{}",
        content_type="application/json",
        CONTENT_LENGTH=str(declared),
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large"
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in error["message"]
    assert not AdapterVersion.objects.exists()


def test_the_web_upload_is_refused_the_same_way(lena, contracts):
    from django.test import Client

    # CSRF enforced, as in a browser: the CSRF check is what would read the body.
    web = Client(enforce_csrf_checks=True)
    web.force_login(lena)
    response = web.post(
        f"/adapters/{contracts.pk}/versions/",
        data=b"--xyz--\r\n",
        content_type=MULTIPART,
        CONTENT_LENGTH=str(LIMIT + 17 * 1024),
    )
    assert response.status_code == 413
    assert b"INGEST_MAX_BYTES" in response.content


@pytest.mark.parametrize("shape", ["archive", "loose"])
def test_files_past_the_limit_are_cut_off_with_413(as_token, contracts, settings, shape):
    files = AdapterSpec(seed=4).files()
    files["padding.bin"] = os.urandom(LIMIT)  # incompressible: the body itself passes the limit
    if shape == "archive":
        uploads = [SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(files))]
    else:
        uploads = [SimpleUploadedFile(name, data) for name, data in files.items()]

    response = as_token.post(
        f"/api/v1/adapters/{contracts.pk}/versions/", {"files": uploads}, format="multipart"
    )

    assert response.status_code == 413, response.json()
    assert response.json()["error"]["code"] == "request_too_large"
    assert not AdapterVersion.objects.exists()
    from registry.artifact_store import get_artifact_store

    assert get_artifact_store().list_prefix("adapters/") == []
    staging = settings.INGEST_STAGING_DIR
    assert not staging.exists() or list(staging.iterdir()) == []


def test_bodies_within_the_limit_still_register(as_token, contracts):
    uploads = [SimpleUploadedFile(n, d) for n, d in AdapterSpec(seed=5).files().items()]
    response = as_token.post(
        f"/api/v1/adapters/{contracts.pk}/versions/", {"files": uploads}, format="multipart"
    )
    assert response.status_code == 201, response.json()


def test_a_web_upload_whose_files_pass_the_limit_is_413_not_a_500(lena, contracts):
    from django.test import Client

    web = Client(enforce_csrf_checks=True)
    web.force_login(lena)
    web.get(f"/adapters/{contracts.pk}/")  # sets the CSRF cookie, as a browser's visit does
    token = web.cookies["csrftoken"].value
    padding = SimpleUploadedFile("padding.bin", os.urandom(LIMIT + 1))
    response = web.post(
        f"/adapters/{contracts.pk}/versions/", {"files": [padding]}, HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 413
    assert b"INGEST_MAX_BYTES" in response.content
