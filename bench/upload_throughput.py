"""Upload throughput and client memory: plain boto3 vs the artifact store.

    .venv/bin/python -m bench.upload_throughput --mb 500

Cases, each against the same S3 endpoint (moto server in its own process unless
--endpoint is given) and the same file:

  a  boto3 upload_file, default client, same part size and concurrency
  b  S3ArtifactStore.put_file
  c  the full registry ingest path (HTTP upload -> staging -> validation -> store);
     not written yet, see `measure_registry_ingest`

Only this process's RSS is measured; the server keeps objects in its own memory.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from registry.storage import S3ArtifactStore
from tests.support import s3_server

MB = 1024 * 1024


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

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.process = psutil.Process()
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


def prepare(ctx: BenchContext) -> None:
    """Build clients before timing: loading botocore's S3 model costs ~10 MiB once."""
    _boto3_client(ctx)
    _store(ctx)


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


def measure_registry_ingest(ctx: BenchContext) -> str:
    """Hook for case (c): the whole registry ingest path, timed end to end.

    To do: start the Django app (runserver or a WSGI server in a thread) with
    ARTIFACT_STORE_URL=s3://<ctx.bucket>/... at ctx.endpoint, create a pipeline
    token, POST ctx.path as an adapter version upload, and return once the version
    is stored (poll its state if ingest is asynchronous). Return the object key
    (or prefix) it wrote so the runner can check the size and delete it.
    The file must then be a real adapter, not random bytes
    (tests.support.adapters can build one of a given size).
    """
    raise NotImplementedError("registry ingest case not written yet")


CASES: list[tuple[str, str, Callable[[BenchContext], str]]] = [
    ("a", "boto3 upload_file (baseline)", measure_boto3_upload_file),
    ("b", "S3ArtifactStore.put_file", measure_store_put_file),
    ("c", "registry ingest (HTTP API)", measure_registry_ingest),
]


# --- runner ----------------------------------------------------------------------------


def make_file(path: Path, size: int) -> None:
    # Random bytes, so nothing on the path can win by compressing.
    block = os.urandom(8 * MB)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


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
    prepare(ctx)
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
        f"{'client CPU s':>12} {'RSS +MiB':>9}"
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
            f"{max(m.rss_growth) / MB:>9.1f}"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=500, help="file size in MiB (500)")
    parser.add_argument("--chunk-mb", type=int, default=16, help="multipart part size (16)")
    parser.add_argument("--concurrency", type=int, default=4, help="upload threads (4)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (1)")
    parser.add_argument("--cases", default="abc", help="which cases to run (abc)")
    parser.add_argument(
        "--endpoint",
        help="use this S3 endpoint instead of starting a moto server; credentials "
        "from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    )
    parser.add_argument("--bucket", default="bench", help="bucket, created if missing")
    parser.add_argument("--workdir", type=Path, help="where to write the test file (tmp)")
    args = parser.parse_args(argv)

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
        path = workdir / f"upload-{args.mb}mb.bin"
        if not path.exists() or path.stat().st_size != args.mb * MB:
            print(f"writing {args.mb} MiB test file to {path} ...", file=sys.stderr)
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
        )
        results = run(ctx, args.repeat, args.cases)
        print_table(ctx, results, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
