from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tracemalloc
import zipfile

import pytest

from registry.ingest import ArtifactRejected, IngestLimits, stage_directory, stage_upload
from tests.registry.ingest.hostile_corpus import as_sources
from tests.support.adapters import (
    AdapterSpec,
    adapter_tar_gz,
    adapter_zip,
    tar_gz_bytes,
    write_adapter_dir,
    zip_bytes,
)

LIMITS = IngestLimits()
FILES = AdapterSpec().files()


@pytest.fixture
def dest(tmp_path):
    path = tmp_path / "staged"
    path.mkdir()
    return path


def plain_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def expected_manifest(files: dict[str, bytes]) -> str:
    lines = "".join(
        f"{name}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n"
        for name, data in sorted(files.items())
    )
    return hashlib.sha256(lines.encode()).hexdigest()


UPLOADS = {
    "tar_gz": lambda: [("adapter.tar.gz", adapter_tar_gz())],
    "tgz_without_a_telling_name": lambda: [("upload", adapter_tar_gz())],
    "plain_tar": lambda: [("adapter.tar", plain_tar(FILES))],
    "zip": lambda: [("adapter.zip", adapter_zip())],
    "loose_files": lambda: list(FILES.items()),
    "loose_files_with_client_paths": lambda: [
        (f"/home/alice/out/{n}", d) for n, d in FILES.items()
    ],
    "tar_gz_in_one_folder": lambda: [
        ("a.tgz", tar_gz_bytes({f"my-adapter/{n}": d for n, d in FILES.items()}))
    ],
    "zip_in_one_folder": lambda: [
        ("a.zip", zip_bytes({f"my-adapter/{n}": d for n, d in FILES.items()}))
    ],
    "tar_of_dot": lambda: [("a.tar", plain_tar({f"./{n}": d for n, d in FILES.items()}))],
}


@pytest.mark.parametrize("build", UPLOADS.values(), ids=UPLOADS.keys())
def test_it_stages_every_supported_shape_to_the_same_flat_files(build, dest):
    staged = stage_upload(as_sources(build()), dest, LIMITS)

    assert staged.root == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(FILES)
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    assert [f.path for f in staged.files] == sorted(FILES)
    for f in staged.files:
        assert f.size == len(FILES[f.path])
        assert f.sha256 == hashlib.sha256(FILES[f.path]).hexdigest()
    assert staged.total_size == sum(len(d) for d in FILES.values())
    assert staged.manifest_sha256 == expected_manifest(FILES)


def test_manifest_is_stable_and_follows_content(tmp_path):
    def manifest(spec: AdapterSpec, name: str) -> str:
        dest = tmp_path / name
        dest.mkdir()
        return stage_upload(
            as_sources([("a.tar.gz", tar_gz_bytes(spec.files()))]), dest, LIMITS
        ).manifest_sha256

    assert manifest(AdapterSpec(), "one") == manifest(AdapterSpec(), "two")
    assert manifest(AdapterSpec(), "three") != manifest(AdapterSpec(seed=1), "four")


def test_zip_and_tar_of_the_same_files_have_the_same_manifest(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    from_tar = stage_upload(as_sources([("a.tar.gz", adapter_tar_gz())]), tmp_path / "a", LIMITS)
    from_zip = stage_upload(as_sources([("a.zip", adapter_zip())]), tmp_path / "b", LIMITS)
    assert from_tar.manifest_sha256 == from_zip.manifest_sha256


def test_it_ignores_macos_metadata_and_hidden_files(dest):
    junk = {
        ".DS_Store": b"x",
        "__MACOSX/._adapter_config.json": b"x",
        "._adapter_config.json": b"x",
    }
    staged = stage_upload(as_sources([("a.zip", zip_bytes(FILES | junk))]), dest, LIMITS)
    assert [f.path for f in staged.files] == sorted(FILES)


def test_it_keeps_a_readme(dest):
    staged = stage_upload(
        as_sources([("a.tar.gz", tar_gz_bytes(FILES | {"README.md": b"# hi"}))]), dest, LIMITS
    )
    assert "README.md" in [f.path for f in staged.files]


class DjangoLikeUpload:
    """Mimics InMemoryUploadedFile (.file) and TemporaryUploadedFile (.temporary_file_path)."""

    def __init__(self, name, data, path=None):
        self.name = name
        self.file = io.BytesIO(data)
        self._path = path
        if path:
            self.temporary_file_path = lambda: str(path)

    def chunks(self, chunk_size=64 * 1024):
        self.file.seek(0)
        while chunk := self.file.read(chunk_size):
            yield chunk


@pytest.mark.parametrize("data", [adapter_zip(), adapter_tar_gz()], ids=["zip", "tar_gz"])
def test_it_reads_seekable_and_temporary_file_uploads(data, dest, tmp_path):
    upload = DjangoLikeUpload("upload", data)
    upload.file.read(10)  # a half-read file must still be read from the start
    assert stage_upload([upload], dest, LIMITS).manifest_sha256 == expected_manifest(FILES)

    on_disk = tmp_path / "upload.bin"
    on_disk.write_bytes(data)
    other = tmp_path / "other"
    other.mkdir()
    upload = DjangoLikeUpload("upload", b"", path=on_disk)
    assert stage_upload([upload], other, LIMITS).manifest_sha256 == expected_manifest(FILES)


def test_it_refuses_a_non_empty_destination(dest):
    (dest / "left-over").write_bytes(b"x")
    with pytest.raises(ValueError):
        stage_upload(as_sources([("a.tar.gz", adapter_tar_gz())]), dest, LIMITS)


def test_it_counts_actual_bytes_for_the_total_limit(dest):
    # Many small files, each under the per-file limit, add up past the total.
    files = {f"part{i}.txt": b"x" * 1000 for i in range(20)}
    limits = IngestLimits(max_total_bytes=10_000, max_file_bytes=5_000)
    with pytest.raises(ArtifactRejected) as caught:
        stage_upload(as_sources([("a.tar", plain_tar(files))]), dest, limits)
    assert (caught.value.code, caught.value.status) == ("upload_too_large", 413)
    assert list(dest.iterdir()) == []


def test_it_rejects_an_archive_uploaded_with_other_files(dest):
    with pytest.raises(ArtifactRejected) as caught:
        stage_upload(
            as_sources([("a.tar.gz", adapter_tar_gz()), ("README.md", b"x")]), dest, LIMITS
        )
    assert (caught.value.code, caught.value.status) == ("unsupported_upload_type", 415)


def test_a_file_named_like_an_adapter_file_is_never_unpacked(dest):
    # A safetensors header length of 0x...8b1f makes the file start like gzip.
    looks_like_gzip = b"\x1f\x8b" + bytes(100)
    staged = stage_upload(
        as_sources([("adapter_model.safetensors", looks_like_gzip)]), dest, LIMITS
    )
    assert [f.path for f in staged.files] == ["adapter_model.safetensors"]


# --- stage_directory ---------------------------------------------------------------


def test_it_stages_a_directory(tmp_path, dest):
    src = write_adapter_dir(tmp_path / "download")
    (src / ".cache" / "huggingface").mkdir(parents=True)
    (src / ".cache" / "huggingface" / "x.lock").write_bytes(b"")
    staged = stage_directory(src, dest, LIMITS)
    assert staged.manifest_sha256 == expected_manifest(FILES)
    assert sorted(p.name for p in src.iterdir()) == [".cache", *sorted(FILES)]  # source untouched


def test_it_flattens_a_directory_holding_one_folder(tmp_path, dest):
    write_adapter_dir(tmp_path / "download" / "checkpoint-100")
    staged = stage_directory(tmp_path / "download", dest, LIMITS)
    assert staged.manifest_sha256 == expected_manifest(FILES)


def test_it_rejects_a_symlink_in_a_directory(tmp_path, dest):
    src = write_adapter_dir(tmp_path / "download")
    (src / "README.md").symlink_to("/etc/passwd")
    with pytest.raises(ArtifactRejected) as caught:
        stage_directory(src, dest, LIMITS)
    assert caught.value.code == "symlink"
    assert list(dest.iterdir()) == []


def test_it_rejects_a_fifo_in_a_directory(tmp_path, dest):
    src = write_adapter_dir(tmp_path / "download")
    os.mkfifo(src / "pipe")
    with pytest.raises(ArtifactRejected) as caught:
        stage_directory(src, dest, LIMITS)
    assert caught.value.code == "special_file"


def test_it_rejects_nested_directories(tmp_path, dest):
    src = write_adapter_dir(tmp_path / "download")
    write_adapter_dir(src / "checkpoint-100")
    with pytest.raises(ArtifactRejected) as caught:
        stage_directory(src, dest, LIMITS)
    assert caught.value.code == "nested_directory"
    assert list(dest.iterdir()) == []


# --- memory --------------------------------------------------------------------------

BIG = 200 * 1024**2
PEAK_LIMIT = 16 * 1024**2


class GeneratedUpload:
    """200 MB that never exists in memory at once."""

    name = "adapter_model.safetensors"

    def __init__(self, block: bytes, count: int) -> None:
        self.block = block
        self.count = count

    def chunks(self, chunk_size=64 * 1024):
        for _ in range(self.count):
            yield self.block


def _peak(run) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_flat_for_a_large_loose_file(dest):
    block = os.urandom(1024 * 1024)
    upload = GeneratedUpload(block, BIG // len(block))
    staged = None

    def run():
        nonlocal staged
        staged = stage_upload([upload], dest, LIMITS)

    assert _peak(run) < PEAK_LIMIT
    expected = hashlib.sha256()
    for _ in range(upload.count):
        expected.update(block)
    assert staged.files[0].size == BIG
    assert staged.files[0].sha256 == expected.hexdigest()


def _write_big_tar(path, block):
    with tarfile.open(path, "w") as archive:
        info = tarfile.TarInfo("adapter_model.safetensors")
        info.size = BIG
        archive.addfile(info, _Repeat(block, BIG))


def _write_big_zip(path, block):
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive,
        archive.open("adapter_model.safetensors", "w", force_zip64=True) as out,
    ):
        for _ in range(BIG // len(block)):
            out.write(block)


@pytest.mark.parametrize("write", [_write_big_tar, _write_big_zip], ids=["tar", "zip"])
def test_memory_stays_flat_for_a_large_archive(write, tmp_path, dest):
    path = tmp_path / "big"
    write(path, os.urandom(1024 * 1024))
    with open(path, "rb") as handle:
        upload = DjangoLikeUpload("big", b"")
        upload.file = handle
        assert _peak(lambda: stage_upload([upload], dest, LIMITS)) < PEAK_LIMIT
    assert (dest / "adapter_model.safetensors").stat().st_size == BIG


class _Repeat(io.RawIOBase):
    def __init__(self, block: bytes, size: int) -> None:
        self.block = block
        self.left = size

    def readable(self):
        return True

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        return out
