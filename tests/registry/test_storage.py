"""Both artifact stores, the S3 one against a real S3 API over HTTP (moto server).

Runs without Django: `pytest tests/registry/test_storage.py -p no:django`.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from registry.ingest.incoming import S3Prefix, SourceRejected, download_s3_prefix
from registry.storage import (
    LocalArtifactStore,
    ObjectNotFound,
    S3ArtifactStore,
    StorageError,
    StoredObject,
    build_artifact_store,
    parse_s3_uri,
    validate_key,
)
from tests.support.s3_server import (
    make_bucket,
    running_s3_server,
    s3_client,
    store_options,
)

MB = 1024 * 1024


@pytest.fixture(scope="module")
def s3_endpoint():
    with running_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(s3_endpoint):
    name = f"t-{uuid.uuid4().hex[:12]}"
    make_bucket(s3_endpoint, name)
    return name


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path):
    if request.param == "local":
        return LocalArtifactStore(tmp_path / "artifacts")
    endpoint = request.getfixturevalue("s3_endpoint")
    name = request.getfixturevalue("bucket")
    return S3ArtifactStore(name, "root/dir", multipart_chunk_mb=5, **store_options(endpoint))


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_random(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 4 * MB)
            f.write(os.urandom(n))
            left -= n
    return path


# --- both stores --------------------------------------------------------------


def test_it_round_trips_a_file(store, tmp_path):
    src = write(tmp_path / "src.bin", b"weights" * 1000)
    store.put_file("adapters/a1/v1/adapter_model.safetensors", src)

    assert store.exists("adapters/a1/v1/adapter_model.safetensors")
    with store.open_read("adapters/a1/v1/adapter_model.safetensors") as f:
        assert f.read() == src.read_bytes()
    dest = tmp_path / "out" / "deep" / "copy.bin"
    store.download_to("adapters/a1/v1/adapter_model.safetensors", dest)
    assert dest.read_bytes() == src.read_bytes()


def test_it_streams_reads_in_chunks(store, tmp_path):
    data = os.urandom(3 * MB + 17)
    store.put_file("big/blob", write(tmp_path / "blob", data))
    with store.open_read("big/blob") as f:
        parts = list(iter(lambda: f.read(MB), b""))
    assert [len(p) for p in parts] == [MB, MB, MB, 17]
    assert b"".join(parts) == data


def test_it_uploads_multipart_files_intact(store, tmp_path):
    # 12 MiB with 5 MiB parts: three parts on S3.
    src = write_random(tmp_path / "mp.bin", 12 * MB)
    store.put_file("mp/file", src, sha256="ab" * 32)
    dest = tmp_path / "mp.out"
    store.download_to("mp/file", dest)
    assert dest.read_bytes() == src.read_bytes()
    assert store.list_prefix("mp/") == [StoredObject("mp/file", 12 * MB)]


def test_it_overwrites_an_existing_key(store, tmp_path):
    store.put_file("k/f", write(tmp_path / "a", b"first"))
    store.put_file("k/f", write(tmp_path / "b", b"second"))
    with store.open_read("k/f") as f:
        assert f.read() == b"second"


def test_it_reports_missing_objects(store, tmp_path):
    assert not store.exists("nope/file")
    with pytest.raises(ObjectNotFound):
        store.open_read("nope/file")
    with pytest.raises(ObjectNotFound):
        store.download_to("nope/file", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # ObjectNotFound is a StorageError, so callers catching infra errors see it too.
    assert issubclass(ObjectNotFound, StorageError)


def test_it_raises_file_not_found_for_a_missing_source(store, tmp_path):
    with pytest.raises(FileNotFoundError):
        store.put_file("k/f", tmp_path / "does-not-exist")


def test_it_lists_by_string_prefix(store, tmp_path):
    src = write(tmp_path / "f", b"12345")
    for key in ["a/v1/x", "a/v1/sub/y", "a/v10/z", "b/v1/x"]:
        store.put_file(key, src)

    assert store.list_prefix("a/v1/") == [
        StoredObject("a/v1/sub/y", 5),
        StoredObject("a/v1/x", 5),
    ]
    assert [o.key for o in store.list_prefix("a/v1")] == [
        "a/v1/sub/y",
        "a/v1/x",
        "a/v10/z",
    ]
    assert store.list_prefix("missing/") == []


def test_it_deletes_a_prefix_and_nothing_else(store, tmp_path):
    src = write(tmp_path / "f", b"x")
    for key in ["a/v1/x", "a/v1/sub/y", "a/v10/z"]:
        store.put_file(key, src)

    store.delete_prefix("a/v1/")
    assert store.list_prefix("a/") == [StoredObject("a/v10/z", 1)]
    store.delete_prefix("a/v1/")  # idempotent
    store.delete_prefix("never/existed/")


@pytest.mark.s3
def test_s3_deletes_more_than_one_batch(s3_endpoint, bucket):
    store = S3ArtifactStore(bucket, "root/dir", **store_options(s3_endpoint))
    client = store.client
    for i in range(1005):
        client.put_object(Bucket=store.bucket, Key=f"root/dir/many/{i:04d}", Body=b"")
    assert len(store.list_prefix("many/")) == 1005
    store.delete_prefix("many/")
    assert store.list_prefix("many/") == []


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "a/../b", "..", "a/./b", "a//b", "a\\b", "a/", "a/\x00", ".~tmp-x"],
)
def test_it_rejects_unsafe_keys(store, tmp_path, key):
    src = write(tmp_path / "f", b"x")
    with pytest.raises(ValueError):
        store.put_file(key, src)
    with pytest.raises(ValueError):
        store.exists(key)
    with pytest.raises(ValueError):
        store.uri(key)


@pytest.mark.parametrize("prefix", ["", "/", "../", "a/../"])
def test_it_rejects_unsafe_prefixes(store, prefix):
    with pytest.raises(ValueError):
        store.delete_prefix(prefix)
    with pytest.raises(ValueError):
        store.list_prefix(prefix)


def test_check_passes_for_a_usable_store(store):
    store.check()


# --- local store --------------------------------------------------------------


def test_local_uri_is_an_absolute_file_url(tmp_path):
    store = LocalArtifactStore(tmp_path)
    assert store.uri("a/b c") == (tmp_path / "a" / "b c").as_uri()
    assert store.uri("a/b").startswith("file:///")


def test_local_store_requires_an_absolute_root():
    with pytest.raises(ValueError):
        LocalArtifactStore("relative/dir")


def test_local_put_is_atomic_when_the_copy_fails(tmp_path, monkeypatch):
    store = LocalArtifactStore(tmp_path / "root")
    store.put_file("k/f", write(tmp_path / "old", b"old contents"))

    def broken_copy(src, dst, length=0):
        dst.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("registry.storage.local.shutil.copyfileobj", broken_copy)
    with pytest.raises(StorageError, match="No space left"):
        store.put_file("k/f", write(tmp_path / "new", b"new contents"))

    assert (tmp_path / "root/k/f").read_bytes() == b"old contents"
    assert os.listdir(tmp_path / "root/k") == ["f"]  # no temp file left behind


def test_local_readers_never_see_a_half_written_file(tmp_path):
    store = LocalArtifactStore(tmp_path / "root")
    a = write(tmp_path / "a", b"A" * 4 * MB)
    b = write(tmp_path / "b", b"B" * 4 * MB)
    store.put_file("k/f", a)
    seen = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            data = (tmp_path / "root/k/f").read_bytes()
            seen.add((len(data), data[:1], data[-1:]))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(20):
        store.put_file("k/f", b if i % 2 == 0 else a)
    stop.set()
    t.join()
    assert seen <= {(4 * MB, b"A", b"A"), (4 * MB, b"B", b"B")}


def test_local_listing_hides_in_progress_temp_files(tmp_path):
    store = LocalArtifactStore(tmp_path)
    store.put_file("a/f", write(tmp_path / "src", b"x"))
    (tmp_path / "a" / ".~tmp-abc123").write_bytes(b"partial")
    assert store.list_prefix("a/") == [StoredObject("a/f", 1)]


def test_local_delete_prefix_removes_emptied_folders(tmp_path):
    store = LocalArtifactStore(tmp_path / "root")
    src = write(tmp_path / "src", b"x")
    store.put_file("a/v1/sub/f", src)
    store.put_file("a/v2/f", src)
    store.delete_prefix("a/v1/")
    assert not (tmp_path / "root/a/v1").exists()
    assert (tmp_path / "root/a/v2/f").exists()


def test_local_check_fails_for_a_root_that_is_a_file(tmp_path):
    write(tmp_path / "file", b"x")
    with pytest.raises(StorageError, match="cannot be created|not a directory"):
        LocalArtifactStore(tmp_path / "file").check()


NOBODY = 65534


def check_as_unprivileged_user(root: Path) -> str:
    """LocalArtifactStore(root).check() by a user without privileges: the error
    it raises, or "" if none. Root ignores permission bits (CAP_DAC_OVERRIDE),
    so as root the check runs in a forked child that has become `nobody`."""
    if os.geteuid() != 0:
        try:
            LocalArtifactStore(root).check()
        except StorageError as exc:
            return str(exc)
        return ""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        message = b"no error"
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            LocalArtifactStore(root).check()
        except StorageError as exc:
            message = str(exc).encode()
        except BaseException as exc:  # any other failure is reported too
            message = f"unexpected {exc!r}".encode()
        os.write(write_end, message)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(child, 0)
    return "" if message == "no error" else message


@pytest.fixture
def shared_tmp():
    """A folder an unprivileged user can reach (pytest's own is root's, 0700)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="storage-check-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_local_check_fails_for_a_read_only_root(shared_tmp):
    root = shared_tmp / "ro"
    root.mkdir(mode=0o500)
    if os.geteuid() == 0:
        os.chown(root, NOBODY, NOBODY)  # its owner may read and enter, not write
    assert check_as_unprivileged_user(root) == f"artifact root {root} is not writable"


def test_local_check_passes_for_a_root_its_user_may_write(shared_tmp):
    """The other side of the read-only check, by the same unprivileged user."""
    root = shared_tmp / "rw"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, NOBODY, NOBODY)
    assert check_as_unprivileged_user(root) == ""


def test_local_check_creates_a_missing_root(tmp_path):
    LocalArtifactStore(tmp_path / "new" / "root").check()
    assert (tmp_path / "new" / "root").is_dir()


# --- S3 store -----------------------------------------------------------------


@pytest.mark.s3
def test_s3_uri_includes_bucket_and_prefix(s3_endpoint, bucket):
    store = S3ArtifactStore(bucket, "/root/dir/", **store_options(s3_endpoint))
    assert store.uri("a/b") == f"s3://{bucket}/root/dir/a/b"
    assert S3ArtifactStore(bucket, **store_options(s3_endpoint)).uri("a") == f"s3://{bucket}/a"


@pytest.mark.s3
def test_s3_keys_live_under_the_store_prefix(s3_endpoint, bucket, tmp_path):
    store = S3ArtifactStore(bucket, "root", **store_options(s3_endpoint))
    store.put_file("a/f", write(tmp_path / "f", b"x"))
    keys = [o["Key"] for o in s3_client(s3_endpoint).list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["root/a/f"]


@pytest.mark.s3
def test_s3_put_records_sha256_as_metadata(s3_endpoint, bucket, tmp_path):
    store = S3ArtifactStore(bucket, **store_options(s3_endpoint))
    store.put_file("a/f", write(tmp_path / "f", b"x"), sha256="00ff" * 16)
    assert store.metadata("a/f") == {"sha256": "00ff" * 16}


@pytest.mark.s3
def test_s3_check_names_a_missing_bucket(s3_endpoint):
    store = S3ArtifactStore("no-such-bucket", **store_options(s3_endpoint))
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        store.check()


@pytest.mark.s3
def test_s3_operations_on_a_missing_bucket_are_storage_errors(s3_endpoint, tmp_path):
    store = S3ArtifactStore("no-such-bucket", **store_options(s3_endpoint))
    with pytest.raises(StorageError) as exc:
        store.list_prefix("a/")
    assert not isinstance(exc.value, ObjectNotFound)
    with pytest.raises(StorageError):
        store.put_file("a/f", write(tmp_path / "f", b"x"))


@pytest.mark.s3
def test_s3_check_fails_fast_for_an_unreachable_endpoint():
    port = _closed_port()
    options = store_options(f"http://127.0.0.1:{port}")
    store = S3ArtifactStore("b-1", connect_timeout=1, max_attempts=1, **options)
    started = time.monotonic()
    with pytest.raises(StorageError, match=f"cannot reach S3 endpoint http://127.0.0.1:{port}"):
        store.check()
    assert time.monotonic() - started < 5


@pytest.mark.s3
def test_s3_check_times_out_on_an_endpoint_that_never_answers():
    with socket.socket() as silent:  # accepts connections, never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        store = S3ArtifactStore("b-1", read_timeout=0.5, max_attempts=1, **store_options(endpoint))
        started = time.monotonic()
        with pytest.raises(StorageError, match="cannot reach S3 endpoint"):
            store.check()
        assert time.monotonic() - started < 5


@pytest.mark.s3
def test_s3_never_shows_the_secret_key(s3_endpoint, bucket):
    # moto accepts any credentials, so a denied-access message cannot be tested here.
    options = store_options(s3_endpoint) | {"secret_key": "s3cr3t-value"}
    store = S3ArtifactStore("no-such-bucket", **options)
    assert "s3cr3t" not in repr(store)
    assert "s3cr3t" not in str(vars(store))
    with pytest.raises(StorageError) as exc:
        store.check()
    assert "s3cr3t" not in str(exc.value)


def test_s3_store_validates_its_options():
    with pytest.raises(ValueError, match="addressing_style"):
        S3ArtifactStore("b-1", addressing_style="sideways")
    with pytest.raises(ValueError, match="at least 5"):
        S3ArtifactStore("b-1", multipart_chunk_mb=1)
    with pytest.raises(ValueError, match="both"):
        S3ArtifactStore("b-1", access_key="only-one")
    with pytest.raises(ValueError):
        S3ArtifactStore("")


def test_s3_read_errors_mid_stream_become_storage_errors():
    from registry.storage.s3 import _S3Reader

    class Body(io.RawIOBase):
        def read(self, n=-1):
            raise ConnectionResetError("peer reset")

    with pytest.raises(StorageError, match="peer reset"):
        io.BufferedReader(_S3Reader(Body(), "s3://b/k")).read()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- memory -------------------------------------------------------------------


def test_put_file_memory_stays_flat_for_a_100mb_file(store, tmp_path):
    size = 100 * MB
    src = write_random(tmp_path / "big.bin", size)
    tracemalloc.start()
    try:
        store.put_file("big/file", src)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 5 MiB parts x 4 threads would be ~20 MiB if parts were buffered; they are not.
    assert peak < size / 10, f"peak {peak / MB:.1f} MiB"
    assert store.list_prefix("big/") == [StoredObject("big/file", size)]


# --- factory ------------------------------------------------------------------


def test_factory_builds_local_stores(tmp_path):
    for url in [str(tmp_path), tmp_path.as_uri(), f"file://localhost{tmp_path}"]:
        store = build_artifact_store(url)
        assert isinstance(store, LocalArtifactStore)
        assert store.root == tmp_path


@pytest.mark.s3
def test_factory_builds_s3_stores(s3_endpoint):
    store = build_artifact_store("s3://my-bucket/some/prefix/", **store_options(s3_endpoint))
    assert isinstance(store, S3ArtifactStore)
    assert (store.bucket, store.prefix) == ("my-bucket", "some/prefix")
    assert build_artifact_store("s3://my-bucket", **store_options(s3_endpoint)).prefix == ""


@pytest.mark.parametrize(
    "url", ["", "relative/dir", "file://host/dir", "http://x/y", "s3://", "s3://B!/x"]
)
def test_factory_rejects_bad_urls(url):
    with pytest.raises(ValueError):
        build_artifact_store(url)


def test_validate_key_returns_good_keys():
    assert (
        validate_key("adapters/a-1/v2/adapter_config.json") == "adapters/a-1/v2/adapter_config.json"
    )


# --- parse_s3_uri -------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://my.bucket-1/a/b/", ("my.bucket-1", "a/b/")),
        ("s3://bucket/a/model.tar.gz", ("bucket", "a/model.tar.gz")),
    ],
)
def test_parse_s3_uri_accepts(uri, expected):
    assert parse_s3_uri(uri) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "bucket/key",
        "http://bucket/key",
        "S3://bucket/key",
        "s3://",
        "s3:///key",
        "s3://ab",
        "s3://Bucket/key",
        "s3://bad..name/key",
        "s3://bucket//key",
        "s3://bucket/a key",
        "s3://bucket/a\nb",
    ],
)
def test_parse_s3_uri_rejects(uri):
    with pytest.raises(ValueError):
        parse_s3_uri(uri)


# --- download_s3_prefix -------------------------------------------------------


@pytest.fixture
def source(s3_endpoint, bucket):
    client = s3_client(s3_endpoint)

    def put(key: str, body: bytes = b"data") -> None:
        client.put_object(Bucket=bucket, Key=key, Body=body)

    put.bucket = bucket
    put.options = store_options(s3_endpoint)
    return put


def fetch(source, uri_key, dest, max_files=100, max_total_bytes=10 * MB):
    return download_s3_prefix(
        f"s3://{source.bucket}/{uri_key}",
        dest,
        max_files=max_files,
        max_total_bytes=max_total_bytes,
        **source.options,
    )


@pytest.mark.s3
def test_download_copies_a_folder_with_relative_names(source, tmp_path):
    source("models/lora/adapter_config.json", b"{}")
    source("models/lora/adapter_model.safetensors", b"w" * 1000)
    source("models/lora/sub/extra.txt", b"e")
    source("models/lora-other/ignored", b"no")
    source("models/lora/", b"")  # folder marker written by consoles

    for uri_key in ["models/lora", "models/lora/"]:
        dest = tmp_path / uri_key.replace("/", "_")
        paths = fetch(source, uri_key, dest)
        assert sorted(p.relative_to(dest).as_posix() for p in paths) == [
            "adapter_config.json",
            "adapter_model.safetensors",
            "sub/extra.txt",
        ]
        assert (dest / "adapter_model.safetensors").read_bytes() == b"w" * 1000


@pytest.mark.s3
def test_download_copies_a_single_object(source, tmp_path):
    source("archives/lora.tar.gz", b"tarball")
    source("archives/lora.tar.gz.sig", b"sig")
    paths = fetch(source, "archives/lora.tar.gz", tmp_path)
    assert paths == [tmp_path / "lora.tar.gz"]
    assert paths[0].read_bytes() == b"tarball"


@pytest.mark.s3
def test_download_rejects_a_missing_prefix(source, tmp_path):
    with pytest.raises(SourceRejected, match="nothing found"):
        fetch(source, "absent/", tmp_path)
    with pytest.raises(SourceRejected, match="nothing found"):
        fetch(source, "absent", tmp_path)


@pytest.mark.s3
def test_download_rejects_a_missing_bucket(source, tmp_path):
    with pytest.raises(SourceRejected, match="does not exist"):
        download_s3_prefix(
            "s3://no-such-bucket/x/",
            tmp_path,
            max_files=1,
            max_total_bytes=1,
            **source.options,
        )


@pytest.mark.s3
def test_download_rejects_too_many_files_before_downloading(source, tmp_path):
    for i in range(6):
        source(f"p/f{i}")
    with pytest.raises(SourceRejected, match="more than 5 files"):
        fetch(source, "p/", tmp_path, max_files=5)
    assert list(tmp_path.iterdir()) == []
    assert len(fetch(source, "p/", tmp_path, max_files=6)) == 6


def test_an_s3_prefix_is_never_read_without_an_allowed_sources_options(tmp_path):
    # It once fell back to a helper that no longer existed (an ImportError at
    # the first registration that reached it); now it refuses plainly.
    from registry.ingest.staging import IngestLimits

    with pytest.raises(RuntimeError, match="no allowed source's client options"):
        S3Prefix("s3://bucket/key").stage(tmp_path, IngestLimits())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.s3
def test_download_rejects_too_many_bytes_before_downloading(source, tmp_path):
    source("p/a", b"x" * 600)
    source("p/b", b"x" * 600)
    with pytest.raises(SourceRejected, match="more than the limit of 1000"):
        fetch(source, "p/", tmp_path, max_total_bytes=1000)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SourceRejected, match="limit"):
        fetch(source, "p/a", tmp_path, max_total_bytes=599)


@pytest.mark.s3
def test_download_enforces_the_byte_limit_while_streaming(source, tmp_path, monkeypatch):
    # An object that grows between listing and reading: simulated by a lying listing.
    source("p/a", b"x" * 5000)
    from registry.ingest import incoming as storage

    real = storage._limited_pages

    def shrunk(*args):
        for obj in real(*args):
            yield obj | {"Size": 1}

    monkeypatch.setattr(storage, "_limited_pages", shrunk)
    with pytest.raises(SourceRejected, match="grew past"):
        fetch(source, "p/", tmp_path, max_total_bytes=1000)
    assert not (tmp_path / "a").exists()  # partial file removed


@pytest.mark.s3
@pytest.mark.parametrize(
    "evil_key",
    ["p/../evil", "p/sub/../../evil", "p/..", "p//abs", "p/a\\..\\b", "p/./x"],
)
def test_download_refuses_keys_that_would_escape(source, tmp_path, evil_key):
    source("p/good", b"ok")
    source(evil_key, b"pwned")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(SourceRejected, match="safe relative path|outside"):
        fetch(source, "p/", dest)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "evil").exists()


@pytest.mark.s3
def test_download_refuses_a_name_that_is_both_file_and_folder(source, tmp_path):
    source("p/a", b"file")
    source("p/a/b", b"nested")
    with pytest.raises(SourceRejected, match="also a folder"):
        fetch(source, "p/", tmp_path)


@pytest.mark.s3
def test_download_reports_an_unreachable_endpoint_as_storage_error(tmp_path):
    with pytest.raises(StorageError):
        download_s3_prefix(
            "s3://bucket/p/",
            tmp_path,
            max_files=1,
            max_total_bytes=1,
            **store_options(f"http://127.0.0.1:{_closed_port()}"),
            max_attempts=1,
        )


def test_factory_ignores_s3_options_for_local_urls(tmp_path):
    store = build_artifact_store(tmp_path.as_uri(), region="us-east-1", max_concurrency=4)
    assert isinstance(store, LocalArtifactStore)


# --- streamed writes ------------------------------------------------------------------


def _no_pending_uploads(store) -> bool:
    if not isinstance(store, S3ArtifactStore):
        return True
    return not store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads")


@pytest.mark.parametrize("size", [0, 1000, 21 * MB + 7])
def test_open_write_streams_an_object_in_pieces(store, size):
    data = os.urandom(size)
    writer = store.open_write("adapters/v1/weights.bin")
    for start in range(0, size, 3 * MB):
        writer.write(data[start : start + 3 * MB])
    assert store.list_prefix("adapters/") == []  # nothing visible before commit
    writer.commit()

    with store.open_read("adapters/v1/weights.bin") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    assert store.list_prefix("adapters/") == [StoredObject("adapters/v1/weights.bin", size)]
    assert _no_pending_uploads(store)


def test_open_write_abort_leaves_nothing(store, tmp_path):
    writer = store.open_write("adapters/v1/weights.bin")
    writer.write(os.urandom(12 * MB))  # past one S3 part: a multipart upload exists
    writer.abort()
    writer.abort()

    assert store.list_prefix("adapters/") == []
    assert _no_pending_uploads(store)
    if isinstance(store, LocalArtifactStore):
        leftovers = [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
        assert leftovers == []


def test_open_write_rejects_unsafe_keys(store):
    with pytest.raises(ValueError):
        store.open_write("../escape")
