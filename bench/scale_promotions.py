"""100 promotions at once on 8 replicas, until all are served, beside the bare
sequence measured in the same run.

    .venv/bin/python -m bench.scale_promotions                    # embedded SQLite + SQLite broker
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x CELERY_BROKER_URL=redis://127.0.0.1:6379/6 \\
      .venv/bin/python -m bench.scale_promotions                  # the production shape

The replicas are the vLLM stand-in (tests/support/vllm_standin.py: one asyncio
process, a port per replica, vLLM's runtime-LoRA contract), started here unless
--replica-urls names running ones. Untimed beforehand: 100 distinct adapters
(tiny generated PEFT folders, tests/support/adapters.py) registered, submitted
and approved through the services.

What is timed:

  product  100 POST /api/v1/promotions/ (Bearer token, in-process API client)
           submitted at once to --post-threads client threads (each holds a
           database connection, as a web server's worker would) -> every one
           of the 100 adapters answers a one-token completion on every replica
           AND every rollout is recorded succeeded. In between, the real
           product path: rollouts enqueued on commit, a `celery worker`
           subprocess (prefork, --concurrency children: the documented rollouts
           worker) stages, loads on every replica, verifies, records. An
           independent poller (asyncio, one request per pending adapter every
           --poll-ms) watches the replicas.
  bare     what a person with shell access would do by hand, for 100 other
           adapters, verifying as the product does: copy the files into a fresh
           folder, then on each replica `POST /v1/load_lora_adapter`,
           `GET /v1/models`, and the fingerprint probe through the adapter and
           through the base model (bench/product_path.bare_verify).
           "sequential": adapter after adapter, replica after replica;
           "parallel": the 100 adapters at once on --post-threads threads, the
           replicas of one adapter at once.

The stand-in's latency model is zero by default (no sleep per load or cold
load), the same for the product and the bare cases; --standin-load-seconds and
--standin-cold-read-seconds set others, and the output says which was used.

It also reads the rollouts' own records (enqueued/started/finished, every
HTTP attempt) to say where the time goes and how many rollouts ran at once.

Everything lives in a throwaway VAR_DIR; with a PostgreSQL DATABASE_URL the
run uses a fresh database beside it, dropped at the end. The Celery queue has
a unique name, so a shared Redis is safe.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from bench import results as bench_results
from bench.product_path import (
    REPO_ROOT,
    Cast,
    Series,
    ThrowawayPostgres,
    bare_cleanup,
    bare_copy,
    bare_on_replica,
    breakdown,
    configure_env,
    percentile,
    route_to_queue,
    start_worker,
    stop_process,
    wait_rollout,
    wait_worker_ready,
)

BASE = "tiny-llama"  # the stand-in's base model, as the deployment names it
# The documented rollouts worker (docs/operators/workers.md, docker-compose, kustomize).
DOCUMENTED_CONCURRENCY = 4

# The tiny Llama of tests/support/adapters.py; only its config is read (the
# stand-in has no weights), to give the deployment its module shapes.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}


# -- replicas ----------------------------------------------------------------------


def start_standin(
    replicas: int, max_cpu_loras: int, log: Path, load_seconds: float, cold_read_seconds: float
) -> tuple[subprocess.Popen, list]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.vllm_standin",
            "--replicas",
            str(replicas),
            "--max-cpu-loras",
            str(max_cpu_loras),
            "--load-seconds",
            f"{load_seconds:g}",
            "--cold-read-seconds",
            f"{cold_read_seconds:g}",
        ],  # fmt: skip
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),  # noqa: SIM115 - lives as long as the stand-in
        text=True,
    )
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"the vLLM stand-in did not start; see {log}")
    return process, json.loads(line)["urls"]


class ServedWatch:
    """Watches, from outside the product, when each (adapter, replica) first
    answers a one-token completion. One request per pending adapter per sweep
    (the next replica it has not answered on), so the watch costs the replicas
    ~100 requests every `interval` rather than 800."""

    def __init__(self, urls: list[str], names: list[str], interval: float, timeout: float):
        self.urls, self.names = urls, names
        self.interval, self.timeout = interval, timeout
        self.served: dict[str, list[float]] = {name: [] for name in names}
        self.requests = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        import aiohttp

        try:
            deadline = time.perf_counter() + self.timeout
            connector = aiohttp.TCPConnector(limit=64)
            async with aiohttp.ClientSession(connector=connector) as session:
                pending = list(self.names)
                while pending:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"{len(pending)} adapters never served everywhere")
                    await asyncio.gather(*(self._advance(session, name) for name in pending))
                    pending = [n for n in pending if len(self.served[n]) < len(self.urls)]
                    if pending:
                        await asyncio.sleep(self.interval)
        except BaseException as error:  # handed to join()
            self.error = error

    async def _advance(self, session, name: str) -> None:
        body = {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        while len(self.served[name]) < len(self.urls):
            url = self.urls[len(self.served[name])]
            self.requests += 1
            async with session.post(url + "/v1/completions", json=body) as response:
                await response.read()
                if response.status != 200:
                    return
            self.served[name].append(time.perf_counter())


# -- the three cases ---------------------------------------------------------------------


def make_sources(root: Path, count: int, rank: int, seed: int) -> list[Path]:
    from tests.support.adapters import AdapterSpec, write_adapter_dir

    return [
        write_adapter_dir(root / f"a{seed + i:05d}", AdapterSpec(r=rank, seed=seed + i))
        for i in range(count)
    ]


def run_product(cast: Cast, deployment, versions, urls, args) -> dict:
    """Times the 100 promotions; returns the figures and the rollouts."""
    from django.db import connection

    from serving.models import Rollout

    names = [v.adapter.served_name for v in versions]
    clients = [cast.api_client() for _ in range(args.post_threads)]
    local = threading.local()
    handed = iter(clients)
    lock = threading.Lock()

    def promote(version) -> tuple[float, int]:
        if not hasattr(local, "client"):
            with lock:
                local.client = next(handed)
        _, returned, rollout_id = cast.promote(deployment.name, version, client=local.client)
        return returned, rollout_id

    def close_connection(_) -> None:
        connection.close()

    watch = ServedWatch(urls, names, args.poll_ms / 1000, timeout=args.timeout)
    with ThreadPoolExecutor(args.post_threads) as pool:
        # Every client thread exists (and holds its connection) before t0.
        list(pool.map(lambda _: time.sleep(0.05), range(args.post_threads)))
        watch.start()
        t0 = time.perf_counter()
        wall0 = time.time()
        results = list(pool.map(promote, versions))
        t_posted = time.perf_counter()
        list(pool.map(close_connection, range(args.post_threads)))
    watch.join()
    t_served = max(max(times) for times in watch.served.values())
    ids = [rollout_id for _, rollout_id in results]
    rollouts = [wait_rollout(i, timeout=args.timeout) for i in ids]
    failed = [r for r in rollouts if r.status != "succeeded"]
    if failed:
        raise RuntimeError(
            f"{len(failed)} rollouts did not succeed, e.g. {failed[0].pk}: "
            f"{failed[0].status}: {failed[0].error}"
        )
    rollouts = list(Rollout.objects.filter(pk__in=ids).prefetch_related("replica_steps__attempts"))
    recorded = max(r.finished_at.timestamp() for r in rollouts) - wall0
    served = t_served - t0
    return {
        "all": max(served, recorded),
        "served": served,
        "recorded": recorded,
        "posted": t_posted - t0,
        "per_adapter": [max(times) - t0 for times in watch.served.values()],
        "rollouts": rollouts,
        "wall0": wall0,
        "returned": {rid: wall0 + (returned - t0) for returned, rid in results},
        "watch_requests": watch.requests,
    }


def run_bare(sources, volume: Path, urls: list[str], parallel: bool, threads: int, tag: str):
    import requests

    names = [f"bare-{tag}-{i:03d}" for i in range(len(sources))]
    local = threading.local()

    def sessions() -> list:
        if not hasattr(local, "sessions"):
            local.sessions = [requests.Session() for _ in urls]
        return local.sessions

    def one_adapter(index: int, replica_pool=None) -> None:
        folder = bare_copy(sources[index], volume, names[index])
        mine = sessions()
        if replica_pool is None:
            for session, url in zip(mine, urls, strict=True):
                bare_on_replica(session, url, names[index], folder, base_name=BASE)
        else:
            list(
                replica_pool.map(
                    lambda i: bare_on_replica(
                        mine[i], urls[i], names[index], folder, base_name=BASE
                    ),
                    range(len(urls)),
                )
            )

    if parallel:
        with ThreadPoolExecutor(threads) as pool, ThreadPoolExecutor(threads) as replica_pool:
            t0 = time.perf_counter()
            list(pool.map(lambda i: one_adapter(i, replica_pool), range(len(sources))))
            seconds = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        for index in range(len(sources)):
            one_adapter(index)
        seconds = time.perf_counter() - t0
    cleanup = [requests.Session() for _ in urls]
    for name in names:
        bare_cleanup(name, urls, cleanup)
    return seconds


def retire_all(cast: Cast, deployment, versions) -> None:
    ids = [cast.retire(deployment, version) for version in versions]
    for rollout_id in ids:
        done = wait_rollout(rollout_id, timeout=300)
        if done.status != "succeeded":
            raise RuntimeError(f"retire rollout {done.pk}: {done.status} {done.error}")


# -- where the time goes -----------------------------------------------------------------


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def analyse(product: dict) -> dict:
    rollouts = product["rollouts"]
    rows = [breakdown(r, product["returned"][r.pk]) for r in rollouts]
    spans = [(r.started_at.timestamp(), r.finished_at.timestamp()) for r in rollouts]
    busy = sum(b - a for a, b in spans)
    return {
        "rows": rows,
        "at_once": most_at_once(spans),
        "busy": busy,
        "first_start": min(a for a, _ in spans) - product["wall0"],
        "last_start": max(a for a, _ in spans) - product["wall0"],
    }


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="each round: all three cases")
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[DOCUMENTED_CONCURRENCY],
        help="the rollouts worker's prefork children; a list (4,8) times the product "
        "once per value, each with its own worker (default: the documented worker's)",
    )
    parser.add_argument("--post-threads", type=int, default=16)
    parser.add_argument("--poll-ms", type=float, default=500.0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--target-seconds", type=float, default=30.0)
    parser.add_argument(
        "--broker", default=None, help="Celery broker (default: $CELERY_BROKER_URL or SQLite)"
    )
    parser.add_argument(
        "--sqlite", action="store_true", help="the embedded SQLite even if DATABASE_URL is set"
    )
    parser.add_argument("--replica-urls", default="", help="running stand-in replicas")
    parser.add_argument("--keep", action="store_true", help="keep the VAR_DIR and logs")
    parser.add_argument("--standin-load-seconds", type=float, default=0.0)
    parser.add_argument("--standin-cold-read-seconds", type=float, default=0.0)
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.adapters, args.replicas, args.rounds, args.post_threads = 4, 2, 1, 4
        args.poll_ms = 50.0

    var_dir = Path(tempfile.mkdtemp(prefix="bench-scale-promotions-"))
    configure_env(var_dir, args.broker)
    if args.sqlite:
        os.environ.pop("DATABASE_URL", None)
    database = os.environ.get("DATABASE_URL", "")
    with ExitStack() as stack:
        if database.startswith(("postgres://", "postgresql://")):
            stack.enter_context(ThrowawayPostgres(database))
        try:
            return _main(args, var_dir)
        except BaseException:
            args.keep = True  # the worker log and the VAR_DIR say what happened
            raise
        finally:
            if args.keep:
                print(f"kept {var_dir}")
            else:
                shutil.rmtree(var_dir, ignore_errors=True)


def _main(args, var_dir: Path) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from config.celery import app

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    route_to_queue(app, queue)
    broker = settings.CELERY_BROKER_URL
    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    log_dir = var_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"VAR_DIR {var_dir}  database {engine}  broker {broker.split('://')[0]}  queue {queue}",
        flush=True,
    )
    call_command("migrate", verbosity=0)

    with ExitStack() as stack:
        # Room for every adapter of every round, so the stand-in never evicts:
        # the deployment is sized for 100 adapters (no LRU thrash to measure here).
        room = args.adapters * 3 + 8
        if args.replica_urls:
            urls = [u.strip().rstrip("/") for u in args.replica_urls.split(",")]
        else:
            standin, urls = start_standin(
                args.replicas, room, log_dir / "standin.log",
                args.standin_load_seconds, args.standin_cold_read_seconds,
            )  # fmt: skip
            stack.callback(stop_process, standin)
        model_dir = var_dir / "tiny-llama"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(TINY_CONFIG))
        volume = var_dir / "adapter-volume"
        volume.mkdir()
        cast = Cast()
        deployment = cast.deployment(
            "scale", urls, volume, model_dir, max_loras=4, max_cpu_loras=room
        )
        sources = var_dir / "sources"
        cases = [f"product-{c}" for c in args.concurrency] + ["seq", "par"]
        figures = {case: Series(case) for case in cases}
        products: dict[str, list[dict]] = {case: [] for case in cases if case.startswith("product")}
        for round_no in range(args.rounds):
            order = cases[round_no % len(cases) :] + cases[: round_no % len(cases)]
            for case in order:
                seed = (round_no * len(cases) + cases.index(case)) * 1000
                files = make_sources(sources / case, args.adapters, args.rank, seed)
                if case.startswith("product"):
                    concurrency = int(case.split("-")[1])
                    product = product_case(
                        cast, deployment, files, seed, urls, args, queue, log_dir, concurrency
                    )
                    figures[case].seconds.append(product["all"])
                    products[case].append(product)
                else:
                    seconds = run_bare(
                        files, volume, urls, case == "par", args.post_threads, f"{seed}"
                    )
                    figures[case].seconds.append(seconds)
                shutil.rmtree(sources / case)
                print(
                    f"round {round_no + 1}/{args.rounds}: {case} {figures[case].seconds[-1]:.2f} s",
                    flush=True,
                )
        report(args, engine, broker, figures, products)
    return 0


def product_case(cast, deployment, files, seed, urls, args, queue, log_dir, concurrency) -> dict:
    """Registers and approves the versions (not timed), starts a rollouts worker
    with `concurrency` children, times the promotions, retires them (not timed)."""
    t0 = time.perf_counter()
    versions = [cast.approved_version(f"s{seed + i:05d}", path) for i, path in enumerate(files)]
    print(
        f"  {len(versions)} versions registered and approved in "
        f"{time.perf_counter() - t0:.1f} s (not timed)",
        flush=True,
    )
    worker_log = log_dir / f"worker-{seed}.log"
    worker = start_worker(queue, worker_log, concurrency=concurrency)
    try:
        wait_worker_ready(worker_log)
        product = run_product(cast, deployment, versions, urls, args)
        print(f"  product {product['all']:.2f} s; retiring (not timed)", flush=True)
        retire_all(cast, deployment, versions)
    finally:
        stop_process(worker)
    product["concurrency"] = concurrency
    return product


def report(args, engine: str, broker: str, figures: dict, products: dict) -> None:
    n, r = args.adapters, args.replicas
    out = bench_results.Results("scale_promotions", args)
    latency = (
        f"stand-in latency model: {args.standin_load_seconds * 1000:g} ms per load, "
        f"{args.standin_cold_read_seconds * 1000:g} ms per cold re-read"
        + (
            " (zero: no sleeps)"
            if not (args.standin_load_seconds or args.standin_cold_read_seconds)
            else ""
        )
        + ", product and bare alike"
        if not args.replica_urls
        else "stand-in latency model: that of the running replicas given (--replica-urls)"
    )
    heading = (
        f"{n} promotions at once on {r} stand-in replicas, {args.rounds} round(s); "
        f"database {engine}, broker {broker.split('://')[0]}, {args.post_threads} client "
        f"threads, adapter r={args.rank} q_proj+v_proj, watch every {args.poll_ms:g} ms; " + latency
    )
    print()
    print(heading)
    out.note(heading)
    table = out.table(
        "cases", ["case (until all are served on all replicas)", "median s", "worst s"],
        f"{n} promotions at once on {r} stand-in replicas",
    )  # fmt: skip
    labels = {
        "seq": "bare, sequential",
        "par": f"bare, parallel ({args.post_threads} threads)",
    }
    for case in products:
        labels[case] = f"product, worker --concurrency={case.split('-')[1]}"
    print(f"{'case (until all are served on all replicas)':<48}{'median s':>10}{'worst s':>10}")
    for case, series in figures.items():
        print(f"{labels[case]:<48}{series.median:10.2f}{max(series.seconds):10.2f}")
        table.row(labels[case], series.median, max(series.seconds))
    print()
    for case, runs in products.items():
        product = figures[case].median
        verdict = out.verdict(
            labels[case], product, target=f"< {args.target_seconds:g} s",
            met=product < args.target_seconds, unit="s",
        )  # fmt: skip
        print(
            f"{labels[case]}: {product:.2f} s (target < {args.target_seconds:g} s: {verdict}); "
            f"{product / figures['seq'].median:.2f}x bare sequential, "
            f"{product / figures['par'].median:.2f}x bare parallel"
        )
        out.headline(
            f"{n} promotions at once, {r} stand-in replicas ({labels[case].split(', ')[1]})",
            f"{product:.1f} s",
            f"bare verified, sequential {figures['seq'].median:.1f} s",
            f"< {args.target_seconds:g} s: {verdict}",
        )
        last = runs[-1]
        print(
            f"  last round: POSTs all returned {last['posted']:.2f} s, all {n} answered on "
            f"every replica {last['served']:.2f} s, all rollouts recorded succeeded "
            f"{last['recorded']:.2f} s; per adapter served: median "
            f"{statistics.median(last['per_adapter']):.2f} s, p95 "
            f"{percentile(last['per_adapter'], 95):.2f} s; the watch sent "
            f"{last['watch_requests']} completions"
        )
        facts = analyse(last)
        rows = facts["rows"]
        print(
            f"  from the rollouts' own records: at most {facts['at_once']} ran at once; "
            f"first started {facts['first_start']:.2f} s, last started "
            f"{facts['last_start']:.2f} s after the first POST; rollout work "
            f"{facts['busy']:.1f} s in all = {facts['busy'] / last['concurrency']:.1f} s "
            f"per worker child"
        )
        keys = ["pickup", "stage", "load", "between", "verify", "record", "total"]
        print(f"  {'per rollout, ms':<14}" + "".join(f"{k:>9}" for k in keys) + f"{'attempts':>10}")
        for label, pick in (("median", statistics.median), ("p95", lambda v: percentile(v, 95))):
            cells = "".join(f"{pick([row[k] for row in rows]) * 1000:9.0f}" for k in keys)
            print(f"  {label:<14}{cells}{pick([row['attempts'] for row in rows]):10.0f}")
    print(
        "pickup: its POST returned -> a worker started it (queueing); stage: -> first HTTP "
        "call; load: the load calls on every replica; verify: models + probe through the "
        "adapter and the base; record: last call -> recorded succeeded."
    )
    out.write()


if __name__ == "__main__":
    sys.exit(main())
