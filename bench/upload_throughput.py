"""Upload throughput and client memory: plain boto3 vs the artifact store.

    .venv/bin/python -m bench.upload_throughput --mb 500

Cases, each against the same S3 endpoint (moto server in its own process unless
--endpoint is given) and the same file:

  a  boto3 upload_file, default client, same part size and concurrency
  b  S3ArtifactStore.put_file
  c  the full registry ingest path over real HTTP: `manage.py runserver` with the
     S3 store at the same endpoint, a pipeline token, and a streamed multipart
     upload (requests-toolbelt) of adapter_config.json + the weights file; timed
     until the 201 arrives, i.e. the version is validated, stored and recorded
  d  the same, with one .tar.gz of those two files (built before timing), which
     the registry unpacks into the store while it arrives

The file is a valid LoRA adapter_model.safetensors (random finite weights, so nothing
on the path can win by compressing), the same file for every case.

"RSS +MiB" is this process's (the client's) peak growth; for cases c and d the registry
server's peak growth is measured too ("server RSS +MiB", psutil on its pid). The S3
server keeps objects in its own memory and is not measured.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from bench import results as bench_results
from registry.storage import S3ArtifactStore
from tests.support import s3_server

MB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BenchContext:
    endpoint: str
    bucket: str
    path: Path
    size: int
    chunk_mb: int
    concurrency: int
    access_key: str
    secret_key: str
    region: str
    # Cases may stash objects here that later cases or cleanup need.
    extras: dict = field(default_factory=dict)

    def key(self, case: str) -> str:
        return f"bench/{case}/{uuid.uuid4().hex}"


@dataclass
class Measurement:
    case: str
    label: str
    seconds: list[float] = field(default_factory=list)
    rss_growth: list[int] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    server_rss_growth: list[int] = field(default_factory=list)
    size: int = 0
    skipped: str = ""

    @property
    def mb_per_s(self) -> float:
        return self.size / MB / statistics.median(self.seconds)

    @property
    def spread(self) -> str:
        rates = [self.size / MB / s for s in self.seconds]
        return f"{min(rates):.0f}-{max(rates):.0f}"


class RssSampler:
    """Peak RSS growth of this process above its level at start, sampled in a thread."""

    def __init__(self, interval: float = 0.005, pid: int | None = None):
        self.interval = interval
        self.process = psutil.Process(pid)
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self.baseline = self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


# --- cases ---------------------------------------------------------------------------
# Each takes the context, uploads ctx.path once and returns the object key it wrote.


def _boto3_client(ctx: BenchContext):
    import boto3

    if "boto3_client" not in ctx.extras:
        ctx.extras["boto3_client"] = boto3.client(
            "s3",
            endpoint_url=ctx.endpoint,
            aws_access_key_id=ctx.access_key,
            aws_secret_access_key=ctx.secret_key,
            region_name=ctx.region,
        )
    return ctx.extras["boto3_client"]


def _store(ctx: BenchContext) -> S3ArtifactStore:
    if "store" not in ctx.extras:
        ctx.extras["store"] = S3ArtifactStore(
            ctx.bucket,
            endpoint_url=ctx.endpoint,
            region=ctx.region,
            access_key=ctx.access_key,
            secret_key=ctx.secret_key,
            addressing_style="path",
            multipart_chunk_mb=ctx.chunk_mb,
            max_concurrency=ctx.concurrency,
        )
    return ctx.extras["store"]


def prepare(ctx: BenchContext, only: str = "") -> None:
    """Build clients before timing: loading botocore's S3 model costs ~10 MiB once.
    The registry server is started here too: its migrate and start-up (~4 s)
    used to be timed as part of the first case (c) run."""
    _boto3_client(ctx)
    _store(ctx)
    if "c" in only or "d" in only:
        _registry(ctx)
    if "d" in only:
        _archive(ctx)


def measure_boto3_upload_file(ctx: BenchContext) -> str:
    from boto3.s3.transfer import TransferConfig

    chunk = ctx.chunk_mb * MB
    key = ctx.key("boto3")
    _boto3_client(ctx).upload_file(
        str(ctx.path),
        ctx.bucket,
        key,
        Config=TransferConfig(
            multipart_threshold=chunk,
            multipart_chunksize=chunk,
            max_concurrency=ctx.concurrency,
        ),
    )
    return key


def measure_store_put_file(ctx: BenchContext) -> str:
    key = ctx.key("store")
    _store(ctx).put_file(key, ctx.path, sha256="0" * 64)
    return key


class RegistryServer:
    """The registry app under `manage.py runserver` in its own process, with its
    own SQLite database and staging folder, storing artifacts in ctx.bucket."""

    def __init__(self, ctx: BenchContext, workdir: Path):
        self.workdir = workdir
        self.port = s3_server.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_"))},
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_SECRET_KEY": "bench-only-" + uuid.uuid4().hex,
            # DEBUG stays off (production's code paths), so the HTTPS redirect
            # would be on; this server speaks plain http on loopback.
            "DJANGO_SECURE_SSL_REDIRECT": "false",
            "DJANGO_SECURE_COOKIES": "false",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "VAR_DIR": str(workdir / "var"),
            "INGEST_STAGING_DIR": str(workdir / "staging"),
            "ARTIFACT_STORE_URL": f"s3://{ctx.bucket}/bench/registry",
            "AWS_ENDPOINT_URL": ctx.endpoint,
            "AWS_ACCESS_KEY_ID": ctx.access_key,
            "AWS_SECRET_ACCESS_KEY": ctx.secret_key,
            "AWS_REGION": ctx.region,
            "AWS_S3_ADDRESSING_STYLE": "path",
            "AWS_S3_MULTIPART_CHUNK_MB": str(ctx.chunk_mb),
            "AWS_S3_MAX_CONCURRENCY": str(ctx.concurrency),
            "LOG_LEVEL": "WARNING",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        self.proc: subprocess.Popen | None = None
        self.token = ""

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode:
            raise SystemExit(f"manage.py {args[0]} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def start(self) -> None:
        bench_results.seed_sqlite(self.workdir / "var")
        self.manage("migrate", "--noinput")
        self.token = self.manage("shell", "-c", _SETUP).strip().splitlines()[-1]
        self.log = open(self.workdir / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"registry server exited:\n{(self.workdir / 'server.log').read_text()}"
                )
            try:
                if self.session().get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("registry server did not become healthy within 60 s")

    def session(self):
        import requests

        session = requests.Session()
        session.trust_env = False  # never through a proxy to loopback
        session.headers["Authorization"] = f"Bearer {self.token}"
        return session

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()


# Run in the server's environment by `manage.py shell -c`; prints the token secret.
_SETUP = """
from django.contrib.auth import get_user_model
from core.actors import Actor
from core.models import Ability, Department, Membership, Role
from core.services.tokens import token_create
department, _ = Department.objects.get_or_create(slug="bench", name="Bench")
user, _ = get_user_model().objects.get_or_create(username="bench-pipeline")
Membership.objects.get_or_create(user=user, department=department, role=Role.MEMBER)
_token, secret = token_create(
    actor=Actor(user=user), department=department, name="bench", abilities=list(Ability.values)
)
print(secret)
"""


def _registry(ctx: BenchContext) -> RegistryServer:
    if "registry" not in ctx.extras:
        workdir = Path(tempfile.mkdtemp(prefix="bench-registry-"))
        server = RegistryServer(ctx, workdir)
        ctx.extras["registry"] = server
        ctx.extras["cleanup"].callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx.extras["cleanup"].callback(server.stop)
        server.start()
    return ctx.extras["registry"]


def measure_registry_ingest(ctx: BenchContext) -> str:
    """Case (c): the whole registry ingest path, timed end to end over HTTP.

    Each run registers version 1 of a fresh adapter (a second upload of the same
    content to one adapter would be refused as a duplicate). The client streams
    the multipart body from disk, so neither side needs the file in memory.
    """
    config = json.dumps(ctx.extras["adapter_config"]).encode()
    with open(ctx.path, "rb") as weights:
        return _post_version(
            ctx,
            [
                ("files", ("adapter_config.json", config, "application/json")),
                ("files", ("adapter_model.safetensors", weights, "application/octet-stream")),
            ],
        )


def measure_registry_archive_ingest(ctx: BenchContext) -> str:
    """Case (d): as (c), with the two files in one .tar.gz."""
    with open(_archive(ctx), "rb") as archive:
        return _post_version(ctx, [("files", ("adapter.tar.gz", archive, "application/gzip"))])


def _archive(ctx: BenchContext) -> Path:
    """adapter_config.json + the weights as a .tar.gz, written once before timing.
    Level 1: the weights are random, so gzip stores them either way."""
    if "archive" not in ctx.extras:
        import tarfile

        path = ctx.path.with_name("adapter.tar.gz")
        config = json.dumps(ctx.extras["adapter_config"]).encode()
        with tarfile.open(path, "w:gz", compresslevel=1) as archive:
            info = tarfile.TarInfo("adapter_config.json")
            info.size = len(config)
            archive.addfile(info, io.BytesIO(config))
            archive.add(ctx.path, arcname="adapter_model.safetensors")
        ctx.extras["archive"] = path
    return ctx.extras["archive"]


def _post_version(ctx: BenchContext, fields: list) -> str:
    from requests_toolbelt.multipart.encoder import MultipartEncoder

    server = _registry(ctx)
    session = server.session()
    name = f"bench-{uuid.uuid4().hex[:12]}"
    created = session.post(
        server.url + "/api/v1/adapters/",
        json={"department": "bench", "name": name, "base_model": "bench-base"},
        timeout=30,
    )
    if created.status_code != 201:
        raise SystemExit(f"creating the adapter failed: {created.status_code} {created.text}")
    adapter_id = created.json()["id"]

    with RssSampler(pid=server.proc.pid) as server_rss:
        body = MultipartEncoder(fields=fields)
        response = session.post(
            f"{server.url}/api/v1/adapters/{adapter_id}/versions/",
            data=body,
            headers={"Content-Type": body.content_type},
            timeout=3600,
        )
    if response.status_code != 201:
        raise SystemExit(f"registration failed: {response.status_code} {response.text[:2000]}")
    ctx.extras.setdefault("server_rss", []).append(server_rss.growth)
    uri = response.json()["artifact_uri"]  # s3://bucket/bench/registry/adapters/.../
    key = uri.removeprefix(f"s3://{ctx.bucket}/") + "adapter_model.safetensors"
    return key


CASES: list[tuple[str, str, Callable[[BenchContext], str]]] = [
    ("a", "boto3 upload_file (baseline)", measure_boto3_upload_file),
    ("b", "S3ArtifactStore.put_file", measure_store_put_file),
    ("c", "registry ingest (HTTP API)", measure_registry_ingest),
    ("d", "registry ingest, .tar.gz archive", measure_registry_archive_ingest),
]


# --- runner ----------------------------------------------------------------------------


LORA_RANK = 8
LORA_HIDDEN = 4096


def adapter_config() -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": LORA_RANK,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "bench-base",
        "bias": "none",
        "use_dora": False,
    }


def make_file(path: Path, size: int) -> int:
    """Write a valid LoRA adapter_model.safetensors of exactly `size` bytes and
    return its layer count. Tensors are F32 lora_A (r x H) / lora_B (H x r) pairs
    for q_proj and v_proj; the weight bytes are random, so nothing on the path can
    win by compressing. The header is padded with spaces (allowed by the format)
    to reach the exact size."""
    pair = 2 * LORA_RANK * LORA_HIDDEN * 4
    layers = max(1, (size - 4 * MB) // (2 * pair))

    def header(layers: int) -> dict:
        entries: dict = {}
        offset = 0
        for layer in range(layers):
            for module in ("q_proj", "v_proj"):
                base = f"base_model.model.model.layers.{layer}.self_attn.{module}"
                for part, shape in (
                    ("lora_A", [LORA_RANK, LORA_HIDDEN]),
                    ("lora_B", [LORA_HIDDEN, LORA_RANK]),
                ):
                    n = shape[0] * shape[1] * 4
                    entries[f"{base}.{part}.weight"] = {
                        "dtype": "F32",
                        "shape": shape,
                        "data_offsets": [offset, offset + n],
                    }
                    offset += n
        return entries

    raw = json.dumps(header(layers)).encode()
    data_size = layers * 2 * pair
    padding = size - 8 - len(raw) - data_size
    if padding < 0:
        raise SystemExit(f"--mb too small for a {LORA_HIDDEN}-wide adapter")
    raw += b" " * padding
    # Random float32 bits with the exponent's top bit cleared: every value is
    # finite (|x| < 2) and nonzero almost surely, so ingest's value scan accepts
    # them, and the bytes still do not compress.
    block = (np.frombuffer(os.urandom(8 * MB), "<u4") & np.uint32(0xBFFFFFFF)).tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        left = data_size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return layers


def delete_everything(ctx: BenchContext, client) -> None:
    # The moto server holds objects in memory; free them between runs.
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=ctx.bucket, Prefix="bench/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=ctx.bucket, Delete={"Objects": keys, "Quiet": True})


def run(ctx: BenchContext, repeat: int, only: str) -> list[Measurement]:
    admin = s3_server.s3_client(ctx.endpoint, access_key=ctx.access_key, secret_key=ctx.secret_key)
    results = {
        case: Measurement(case, label, size=ctx.size) for case, label, _fn in CASES if case in only
    }
    prepare(ctx, only)
    # Interleaved, order reversed every other round, so drift (page cache, the
    # server's heap after the previous upload) does not always favour one case.
    for round_no in range(repeat):
        for case, _label, fn in CASES if round_no % 2 == 0 else CASES[::-1]:
            m = results.get(case)
            if m is None or m.skipped:
                continue
            gc.collect()
            cpu_before = sum(psutil.Process().cpu_times()[:2])
            try:
                with RssSampler() as rss:
                    started = time.perf_counter()
                    key = fn(ctx)
                    elapsed = time.perf_counter() - started
            except NotImplementedError as exc:
                m.skipped = str(exc)
                continue
            stored = admin.head_object(Bucket=ctx.bucket, Key=key)["ContentLength"]
            if stored != ctx.size:
                raise SystemExit(f"case {case}: stored {stored} bytes, expected {ctx.size}")
            m.seconds.append(elapsed)
            m.rss_growth.append(rss.growth)
            m.cpu_seconds.append(sum(psutil.Process().cpu_times()[:2]) - cpu_before)
            if case in ("c", "d"):
                m.server_rss_growth.append(ctx.extras["server_rss"][-1])
            delete_everything(ctx, admin)
    return list(results.values())


def print_table(ctx: BenchContext, results: list[Measurement], repeat: int) -> None:
    print(
        f"\nfile {ctx.size / MB:.0f} MiB, part {ctx.chunk_mb} MiB, concurrency "
        f"{ctx.concurrency}, {repeat} run(s) each; median time and CPU, MB/s range, "
        "max RSS growth; "
        f"endpoint {ctx.endpoint}\n"
    )
    baseline = next((m for m in results if m.case == "a" and m.seconds), None)
    header = (
        f"{'case':<34} {'seconds':>8} {'MB/s':>7} {'range':>9} {'vs a':>5} "
        f"{'client CPU s':>12} {'RSS +MiB':>9} {'server RSS +MiB':>16}"
    )
    print(header)
    print("-" * len(header))
    for m in results:
        label = f"{m.case}  {m.label}"
        if not m.seconds:
            print(f"{label:<34} {'-':>8}  ({m.skipped})")
            continue
        ratio = f"{m.mb_per_s / baseline.mb_per_s:.2f}" if baseline else "-"
        print(
            f"{label:<34} {statistics.median(m.seconds):>8.2f} {m.mb_per_s:>7.1f} "
            f"{m.spread:>9} {ratio:>5} {statistics.median(m.cpu_seconds):>12.2f} "
            f"{max(m.rss_growth) / MB:>9.1f} "
            + (f"{max(m.server_rss_growth) / MB:>16.1f}" if m.server_rss_growth else f"{'-':>16}")
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=500, help="file size in MiB (500)")
    parser.add_argument("--chunk-mb", type=int, default=16, help="multipart part size (16)")
    parser.add_argument("--concurrency", type=int, default=4, help="upload threads (4)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (1)")
    parser.add_argument("--cases", default="abcd", help="which cases to run (abcd)")
    parser.add_argument(
        "--endpoint",
        help="use this S3 endpoint instead of starting a moto server; credentials "
        "from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    )
    parser.add_argument("--bucket", default="bench", help="bucket, created if missing")
    parser.add_argument("--workdir", type=Path, help="where to write the test file (tmp)")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # every case, a file of a few parts
        args.mb, args.chunk_mb, args.repeat = 8, 5, 1

    with ExitStack() as stack:
        if args.endpoint:
            endpoint = args.endpoint
            access_key = os.environ.get("AWS_ACCESS_KEY_ID", s3_server.ACCESS_KEY)
            secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY", s3_server.SECRET_KEY)
        else:
            endpoint = stack.enter_context(s3_server.running_s3_server())
            access_key, secret_key = s3_server.ACCESS_KEY, s3_server.SECRET_KEY
        admin = s3_server.s3_client(endpoint, access_key=access_key, secret_key=secret_key)
        if args.bucket not in {b["Name"] for b in admin.list_buckets().get("Buckets", [])}:
            admin.create_bucket(Bucket=args.bucket)

        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-upload-"))
        )
        path = workdir / f"adapter_model-{args.mb}mb.safetensors"
        print(f"writing {args.mb} MiB adapter weights to {path} ...", file=sys.stderr)
        make_file(path, args.mb * MB)
        ctx = BenchContext(
            endpoint=endpoint,
            bucket=args.bucket,
            path=path,
            size=args.mb * MB,
            chunk_mb=args.chunk_mb,
            concurrency=args.concurrency,
            access_key=access_key,
            secret_key=secret_key,
            region=s3_server.REGION,
            extras={"cleanup": stack, "adapter_config": adapter_config()},
        )
        results = run(ctx, args.repeat, args.cases)
        print_table(ctx, results, args.repeat)
        write_results(args, ctx, results)
    return 0


def write_results(args, ctx: BenchContext, results: list[Measurement]) -> None:
    out = bench_results.Results("upload_throughput", args)
    out.note(
        f"file {ctx.size / MB:.0f} MiB, part {ctx.chunk_mb} MiB, concurrency {ctx.concurrency}, "
        f"{args.repeat} run(s) each, endpoint {'moto server' if not args.endpoint else 'given'}"
    )
    table = out.table(
        "cases",
        ["case", "seconds", "MB/s", "range", "vs a", "client CPU s", "RSS +MiB", "server RSS +MiB"],
        "uploads to S3",
    )
    baseline = next((m for m in results if m.case == "a" and m.seconds), None)
    for m in results:
        if not m.seconds:
            table.row(f"{m.case}  {m.label}", None, None, m.skipped, None, None, None, None)
            continue
        table.row(
            f"{m.case}  {m.label}",
            statistics.median(m.seconds),
            m.mb_per_s,
            m.spread,
            f"{m.mb_per_s / baseline.mb_per_s:.2f}" if baseline else "-",
            statistics.median(m.cpu_seconds),
            max(m.rss_growth) / MB,
            max(m.server_rss_growth) / MB if m.server_rss_growth else None,
        )
    archive = next((m for m in results if m.case == "d" and m.seconds), None)
    if archive and baseline:
        ratio = archive.mb_per_s / baseline.mb_per_s
        rss = max(archive.server_rss_growth) / MB if archive.server_rss_growth else 0.0
        out.headline(
            f"{ctx.size / MB:.0f} MiB `.tar.gz` upload into S3",
            f"{ratio:.2f}× boto3, server RSS +{rss:.0f} MiB",
            "boto3 `upload_file`",
            f"≥ 0.70×: {'met' if ratio >= 0.7 else 'MISSED'}; "
            f"< 64 MiB: {'met' if rss < 64 else 'MISSED'}",
        )
    out.write()


if __name__ == "__main__":
    sys.exit(main())
