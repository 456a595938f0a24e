"""Loose files and tar archives are streamed into the store while the request
arrives (registry.ingest.streamed); a zip keeps the staging path. All must agree
on content identity, and a refused upload must leave nothing in the store."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.ingest.errors import ArtifactRejected
from registry.ingest.staging import IngestLimits, stage_upload
from registry.models import AdapterVersion
from registry.storage import LocalArtifactStore, S3ArtifactStore
from tests.factories import make_adapter
from tests.registry.ingest.hostile_corpus import as_sources
from tests.support.adapters import AdapterSpec, tar_gz_bytes, zip_bytes

pytestmark = pytest.mark.django_db


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


def post_files(client, adapter, files: dict[str, bytes]):
    return client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [SimpleUploadedFile(name, data) for name, data in files.items()]},
        format="multipart",
    )


def assert_store_empty(store):
    assert store.list_prefix("adapters/") == []
    if isinstance(store, S3ArtifactStore):
        assert not store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads")
    staging = Path(django_settings.INGEST_STAGING_DIR)
    assert not staging.exists() or list(staging.iterdir()) == []


@pytest.mark.s3
def test_loose_files_land_in_s3_with_their_sha256s(as_token, contracts, s3_store, tmp_path):
    files = AdapterSpec(seed=3).files()

    response = post_files(as_token, contracts, files)

    assert response.status_code == 201, response.json()
    version = AdapterVersion.objects.get(pk=response.json()["id"])
    stored = {o.key.rpartition("/")[2]: o.size for o in s3_store.list_prefix("adapters/")}
    assert stored == {name: len(data) for name, data in files.items()}
    for entry in version.files:
        with s3_store.open_read(f"{version.storage_prefix}/{entry['path']}") as f:
            assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
        assert entry["sha256"] == hashlib.sha256(files[entry["path"]]).hexdigest()
    # The same manifest stage_upload computes for the same files.
    dest = tmp_path / "staged"
    dest.mkdir()
    staged = stage_upload(as_sources(list(files.items())), dest, IngestLimits())
    assert version.manifest_sha256 == staged.manifest_sha256
    assert version.total_size == staged.total_size
    assert not s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads")


@pytest.mark.s3
def test_an_archive_of_streamed_files_is_a_duplicate(as_token, contracts, s3_store):
    files = AdapterSpec(seed=4).files()
    assert post_files(as_token, contracts, files).status_code == 201

    archive = SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(files))
    response = as_token.post(
        f"/api/v1/adapters/{contracts.pk}/versions/", {"files": [archive]}, format="multipart"
    )

    assert response.status_code == 409, response.json()
    assert response.json()["error"]["details"] == {"duplicate_of": 1}


@pytest.mark.s3
def test_loose_files_of_an_archived_version_are_a_duplicate(as_token, contracts, s3_store):
    files = AdapterSpec(seed=5).files()
    archive = SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(files))
    first = as_token.post(
        f"/api/v1/adapters/{contracts.pk}/versions/", {"files": [archive]}, format="multipart"
    )
    assert first.status_code == 201
    before = s3_store.list_prefix("adapters/")

    response = post_files(as_token, contracts, files)

    assert response.status_code == 409, response.json()
    assert s3_store.list_prefix("adapters/") == before  # the streamed copy was deleted
    assert not s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads")


def _rank_mismatch() -> dict[str, bytes]:
    files = AdapterSpec(r=4).files()
    files["adapter_config.json"] = AdapterSpec(r=8).files()["adapter_config.json"]
    return files


REFUSED = {
    "bad_config": (
        lambda: {**AdapterSpec().files(), "adapter_config.json": b"{not json"},
        "invalid_config",
    ),
    "pickle_bin": (
        lambda: {
            "adapter_config.json": AdapterSpec().files()["adapter_config.json"],
            "adapter_model.bin": b"\x80\x04pickle" + os.urandom(1000),
        },
        "pickle_weights",
    ),
    "rank_mismatch": (_rank_mismatch, None),
    # The local copy holds only the header: these values are seen only as they stream past.
    "nan_weights": (lambda: AdapterSpec(poison="nan").files(), "non_finite_weights"),
    "untrained_zero_b": (lambda: AdapterSpec(poison="zero_b").files(), "adapter_changes_nothing"),
}


@pytest.mark.s3
@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_a_refused_loose_upload_leaves_nothing_in_s3(
    case, as_token, contracts, s3_store, monkeypatch
):
    build, code = REFUSED[case]
    streamed = []
    original = S3ArtifactStore.open_write

    def spying(self, key):
        streamed.append(key.rpartition("/")[2])
        return original(self, key)

    monkeypatch.setattr(S3ArtifactStore, "open_write", spying)

    response = post_files(as_token, contracts, build())

    assert response.status_code == 400, response.json()
    assert streamed  # it took the streamed path
    if code:
        assert response.json()["error"]["code"] == code
    assert not AdapterVersion.objects.exists()
    assert_store_empty(s3_store)


@pytest.mark.s3
def test_the_size_limit_stops_a_loose_file_mid_stream(
    as_token, contracts, s3_store, settings, monkeypatch
):
    settings.INGEST_MAX_BYTES = 20 * 1024**2
    # The declared length passes, so the body is cut off while it streams.
    settings.INGEST_MULTIPART_ALLOWANCE_BYTES = 8 * 1024**2
    seen = []
    original = S3ArtifactStore.open_write

    def spying(self, key):
        writer = original(self, key)
        seen.append(writer)
        return writer

    monkeypatch.setattr(S3ArtifactStore, "open_write", spying)
    files = {
        "adapter_config.json": AdapterSpec().files()["adapter_config.json"],
        "adapter_model.safetensors": os.urandom(24 * 1024**2),
    }

    response = post_files(as_token, contracts, files)

    assert response.status_code == 413, response.json()
    # core.body_limit counts every file byte ahead of the streaming handler.
    assert response.json()["error"]["code"] == "request_too_large"
    assert len(seen) == 2  # both files were on their way to the store
    assert not AdapterVersion.objects.exists()
    assert_store_empty(s3_store)


@pytest.mark.s3
def test_an_outsiders_upload_writes_nothing(as_fred, contracts, s3_store, monkeypatch):
    def never(self, key):
        raise AssertionError("an outsider's upload reached the store")

    monkeypatch.setattr(S3ArtifactStore, "open_write", never)

    response = post_files(as_fred, contracts, AdapterSpec().files())

    assert response.status_code == 404
    assert_store_empty(s3_store)


def test_loose_files_on_the_local_store_leave_no_temp_files(as_lena, contracts, tmp_path):
    files = AdapterSpec(seed=6).files()

    response = post_files(as_lena, contracts, files)

    assert response.status_code == 201, response.json()
    stored = sorted(p.name for p in (tmp_path / "artifacts").rglob("*") if p.is_file())
    assert stored == sorted(files)
    staging = Path(django_settings.INGEST_STAGING_DIR)
    assert list(staging.iterdir()) == []


def test_a_loose_file_with_an_unusual_name_joins_the_streamed_ones(as_lena, contracts):
    files = {**AdapterSpec(seed=7).files(), "NOTES": b"trained on contracts"}

    response = post_files(as_lena, contracts, files)

    # "NOTES" arrives as a temporary file, then goes the streamed way: same
    # rule as stage_upload (not an adapter file).
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "unexpected_file"


def test_an_archive_next_to_loose_files_is_refused(as_lena, contracts, tmp_path):
    files = AdapterSpec(seed=8).files()
    upload = {**files, "adapter.tar.gz": tar_gz_bytes(files)}

    response = post_files(as_lena, contracts, upload)

    assert response.status_code == 415, response.json()
    assert response.json()["error"]["code"] == "unsupported_upload_type"
    assert not [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]


def test_validation_reads_the_weights_header_from_a_sparse_copy(as_lena, contracts):
    spec = AdapterSpec(seed=9)
    files = spec.files()
    header_len = int.from_bytes(files["adapter_model.safetensors"][:8], "little")
    assert len(files["adapter_model.safetensors"]) > 8 + header_len  # data follows the header

    response = post_files(as_lena, contracts, files)

    assert response.status_code == 201, response.json()
    assert response.json()["tensor_count"] == len(spec.tensors())
    assert json.loads(files["adapter_config.json"])["r"] == response.json()["r"]


# --- archives ------------------------------------------------------------------------


def post_archive(client, adapter, name: str, data: bytes):
    return client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [SimpleUploadedFile(name, data)]},
        format="multipart",
    )


@pytest.fixture
def opened_keys(monkeypatch):
    """Keys the request wrote through a streaming writer (open_write), in order."""
    keys = []
    for store_class in (S3ArtifactStore, LocalArtifactStore):
        original = store_class.open_write

        def spying(self, key, original=original):
            keys.append(key.rpartition("/")[2])
            return original(self, key)

        monkeypatch.setattr(store_class, "open_write", spying)
    return keys


@pytest.mark.s3
def test_a_tar_gz_is_unpacked_into_s3_while_it_arrives(
    as_token, contracts, s3_store, opened_keys, tmp_path
):
    files = AdapterSpec(seed=11).files()
    wrapped = {f"my-adapter/{name}": data for name, data in files.items()}

    response = post_archive(as_token, contracts, "adapter.tar.gz", tar_gz_bytes(wrapped))

    assert response.status_code == 201, response.json()
    assert sorted(opened_keys) == sorted(files)  # each member streamed, none staged
    version = AdapterVersion.objects.get(pk=response.json()["id"])
    stored = {o.key.rpartition("/")[2]: o.size for o in s3_store.list_prefix("adapters/")}
    assert stored == {name: len(data) for name, data in files.items()}
    for entry in version.files:
        with s3_store.open_read(f"{version.storage_prefix}/{entry['path']}") as f:
            assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
    dest = tmp_path / "staged"
    dest.mkdir()
    staged = stage_upload(as_sources([("a.tar.gz", tar_gz_bytes(wrapped))]), dest, IngestLimits())
    assert version.manifest_sha256 == staged.manifest_sha256
    assert version.total_size == staged.total_size
    assert not s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads")
    staging = Path(django_settings.INGEST_STAGING_DIR)
    assert list(staging.iterdir()) == []


def test_a_plain_tar_streams_too(as_lena, contracts, opened_keys):
    files = AdapterSpec(seed=12).files()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))

    response = post_archive(as_lena, contracts, "adapter.tar", buffer.getvalue())

    assert response.status_code == 201, response.json()
    assert sorted(opened_keys) == sorted(files)


def test_a_zip_is_still_spooled_and_staged(as_lena, contracts, opened_keys, tmp_path):
    files = AdapterSpec(seed=13).files()

    response = post_archive(as_lena, contracts, "adapter.zip", zip_bytes(files))

    assert response.status_code == 201, response.json()
    assert opened_keys == []  # the zip's directory is at its end: staged, then put_file
    stored = sorted(p.name for p in (tmp_path / "artifacts").rglob("*") if p.is_file())
    assert stored == sorted(files)


@pytest.mark.s3
def test_an_archive_refused_after_members_were_stored_leaves_nothing(
    as_token, contracts, s3_store, opened_keys
):
    # The layout is only known at the end: the adapter's files are already in
    # the store when a nested entry makes the archive invalid.
    files = {**AdapterSpec(seed=14).files(), "docs/extra/notes.md": b"nested"}

    response = post_archive(as_token, contracts, "adapter.tar.gz", tar_gz_bytes(files))

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "nested_directory"
    assert set(opened_keys) == {"adapter_config.json", "adapter_model.safetensors"}
    assert not AdapterVersion.objects.exists()
    assert_store_empty(s3_store)


@pytest.mark.s3
def test_the_size_limit_stops_an_archive_mid_stream(as_token, contracts, s3_store, settings):
    settings.INGEST_MAX_BYTES = 8 * 1024**2
    spec = AdapterSpec(seed=15)
    files = {
        "adapter_config.json": spec.files()["adapter_config.json"],
        "adapter_model.safetensors": os.urandom(5 * 1024**2),
        # Compresses to almost nothing: the body stays under the request limit
        # (core.body_limit), and it is the unpacked size that passes the limit.
        "README.md": bytes(5 * 1024**2),
    }

    response = post_archive(as_token, contracts, "adapter.tar.gz", tar_gz_bytes(files))

    assert response.status_code == 413, response.json()
    assert response.json()["error"]["code"] == "upload_too_large"
    assert not AdapterVersion.objects.exists()
    assert_store_empty(s3_store)


def test_files_after_a_streamed_archive_are_refused(as_lena, contracts, tmp_path):
    files = AdapterSpec(seed=16).files()
    upload = {"adapter.tar.gz": tar_gz_bytes(files), **files}

    response = post_files(as_lena, contracts, upload)

    assert response.status_code == 415, response.json()
    assert response.json()["error"]["code"] == "unsupported_upload_type"
    assert "'adapter.tar.gz'" in response.json()["error"]["message"]
    assert not [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
    assert list(Path(django_settings.INGEST_STAGING_DIR).iterdir()) == []


# --- per-file checks -------------------------------------------------------------------


@pytest.fixture
def file_checks(monkeypatch):
    """Installs per-file checks on the API's streaming handler; returns the list to fill."""
    from registry.api import views
    from registry.ingest.streamed import install_streaming_handler

    checks: list = []
    monkeypatch.setattr(
        views,
        "install_streaming_handler",
        functools.partial(install_streaming_handler, file_checks=checks),
    )
    return checks


class Digesting:
    """A FileCheck that records the sha256 of the bytes it was fed."""

    def __init__(self, name: str, seen: dict):
        self.name, self.seen, self.digest = name, seen, hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)

    def finish(self) -> None:
        self.seen[self.name] = self.digest.hexdigest()


@pytest.mark.parametrize("form", ["loose", "tar.gz"])
def test_every_streamed_file_passes_through_the_file_checks(form, as_lena, contracts, file_checks):
    seen: dict = {}
    file_checks.append(lambda name: Digesting(name, seen))
    files = AdapterSpec(seed=21).files()

    if form == "loose":
        response = post_files(as_lena, contracts, files)
    else:
        response = post_archive(as_lena, contracts, "adapter.tar.gz", tar_gz_bytes(files))

    assert response.status_code == 201, response.json()
    assert seen == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


@pytest.mark.s3
@pytest.mark.parametrize("form", ["loose", "tar.gz"])
def test_a_file_check_that_refuses_stops_the_upload_and_leaves_nothing(
    form, as_token, contracts, s3_store, file_checks
):
    class Refusing(Digesting):
        def finish(self) -> None:
            raise ArtifactRejected("bad_tensor_values", f"{self.name!r} is refused.")

    file_checks.append(lambda name: Refusing(name, {}) if name.endswith(".safetensors") else None)
    files = AdapterSpec(seed=22).files()

    if form == "loose":
        response = post_files(as_token, contracts, files)
    else:
        response = post_archive(as_token, contracts, "adapter.tar.gz", tar_gz_bytes(files))

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "bad_tensor_values"
    assert not AdapterVersion.objects.exists()
    assert_store_empty(s3_store)
