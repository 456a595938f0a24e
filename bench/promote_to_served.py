"""Promote-to-served on real vLLM replicas, beside the bare sequence.

    .venv/bin/python -m bench.promote_to_served                      # 15 rounds, SQLite broker
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 .venv/bin/python -m bench.promote_to_served

What is timed, each round with a NEW adapter (fresh served name, so no swap):

  product  POST /api/v1/promotions/ (Bearer token, in-process API client) returns
           -> a one-token completion with model=<served_name> answers 200 on EVERY
           replica. In between: the real product path, i.e. the rollout enqueued on
           commit, a `celery worker` subprocess on the configured broker picks it up,
           stages the files (copy, sha256, fsync, rename), loads into every replica in
           parallel, verifies, records. Each replica is polled by its own thread.
  bare     what a person with shell access would do by hand: copy the adapter's
           files into a fresh folder, then `POST /v1/load_lora_adapter` and one
           completion on each replica. "sequential" goes replica after replica (as
           the issue words it); "parallel" does the replicas at once (the stricter
           baseline on 4 replicas).

Each case runs on a deployment of 1 replica and one of 4 replicas (real vLLM
servers started here from scripts/vllm/serve.sh). The order of cases rotates
every round. The script also reads the rollout's own records (started_at, every
HTTP attempt, finished_at) to say where the product's time goes.

Everything lives in a throwaway VAR_DIR (SQLite, artifacts, adapter volume,
the embedded SQLite broker) unless DATABASE_URL is set; the Celery queue has a
unique name, so a shared Redis is safe.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.product_path import (
    Cast,
    Series,
    bare_cleanup,
    bare_copy,
    bare_on_replica,
    breakdown,
    configure_env,
    route_to_queue,
    start_worker,
    stop_process,
    wait_rollout,
    wait_worker_ready,
)

# -- replicas ----------------------------------------------------------------------


class Poller:
    """Polls every replica with a one-token completion until each answers 200."""

    def __init__(self, urls: list[str], interval: float) -> None:
        import requests

        self.urls = urls
        self.interval = interval
        self.sessions = [requests.Session() for _ in urls]

    def _one(self, index: int, name: str, deadline: float, failed) -> float:
        session, url = self.sessions[index], self.urls[index]
        body = {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        while time.perf_counter() < deadline and not failed():
            response = session.post(url + "/v1/completions", json=body, timeout=10)
            if response.status_code == 200:
                return time.perf_counter()
            time.sleep(self.interval)
        raise TimeoutError(f"{name} never answered on {url} (rollout failed or too slow)")

    def wait_served(self, name: str, failed, timeout: float = 120) -> float:
        """Returns the perf_counter time at which the LAST replica answered 200.
        `failed()` is polled too, so a failed rollout stops the wait at once."""
        deadline = time.perf_counter() + timeout
        with ThreadPoolExecutor(len(self.urls)) as pool:
            times = list(
                pool.map(lambda i: self._one(i, name, deadline, failed), range(len(self.urls)))
            )
        return max(times)


def bare_sequence(
    source: Path, volume: Path, name: str, urls: list[str], sessions, parallel: bool
) -> float:
    """Copy the files to a fresh folder, then load + one completion on each replica."""
    t0 = time.perf_counter()
    folder = bare_copy(source, volume, name)

    def on_replica(index: int) -> None:
        bare_on_replica(sessions[index], urls[index], name, folder)

    if parallel:
        with ThreadPoolExecutor(len(urls)) as pool:
            list(pool.map(on_replica, range(len(urls))))
    else:
        for index in range(len(urls)):
            on_replica(index)
    return time.perf_counter() - t0


# -- the product -----------------------------------------------------------------------


class Product(Cast):
    """The cast, and deployments of 1 and 4 replicas."""

    def __init__(self, servers, volume: Path, model_dir: Path) -> None:
        super().__init__()
        self.deployments = {}
        for count in (1, 4):
            self.deployments[count] = self.deployment(
                f"bench-{count}",
                [s.base_url for s in servers[:count]],
                volume,
                model_dir,
                max_loras=2,
                max_cpu_loras=4,
            )

    def failed_check(self, rollout_id: int):
        """A cheap callable for the pollers: did the rollout end without success?
        Reads the database at most every 200 ms (on its own thread's connection)."""
        from django.db import connection

        from serving.models import Rollout
        from serving.transitions import ROLLOUT_TERMINAL

        state = {"at": 0.0, "failed": False}

        def failed() -> bool:
            now = time.monotonic()
            if now - state["at"] > 0.2:
                state["at"] = now
                status = Rollout.objects.values_list("status", flat=True).get(pk=rollout_id)
                state["failed"] = status in ROLLOUT_TERMINAL and status != "succeeded"
                connection.close()
            return state["failed"]

        return failed

    def retire_now(self, count: int, version) -> None:
        done = wait_rollout(self.retire(self.deployments[count], version))
        if done.status != "succeeded":
            raise RuntimeError(f"retire rollout {done.pk}: {done.status} {done.error}")


# -- main --------------------------------------------------------------------------------


@dataclass
class _Existing:
    base_url: str


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument(
        "--broker", default=None, help="Celery broker (default: $CELERY_BROKER_URL or SQLite)"
    )
    parser.add_argument(
        "--poll-ms",
        type=float,
        default=20.0,
        help="pause between probes of one replica (each probe costs vLLM ~5 ms of CPU here)",
    )
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the VAR_DIR and logs")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per vLLM server")
    parser.add_argument(
        "--replica-urls",
        default="",
        help="4 comma-separated URLs of vLLM servers already running the tiny model "
        "(runtime LoRA on); default: start 4 here",
    )
    args = parser.parse_args(argv)

    var_dir = Path(tempfile.mkdtemp(prefix="bench-promote-"))
    configure_env(var_dir, args.broker)

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from config.celery import app
    from tests.support.adapters import AdapterSpec, write_adapter_dir
    from tests.support.vllm_servers import ensure_tiny_model, start_servers, stop_all

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    route_to_queue(app, queue)
    broker = settings.CELERY_BROKER_URL
    log_dir = var_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"VAR_DIR {var_dir}  broker {broker.split('@')[-1]}  queue {queue}", flush=True)

    call_command("migrate", verbosity=0)
    model_dir = ensure_tiny_model()
    if args.replica_urls:
        servers = [_Existing(url.strip()) for url in args.replica_urls.split(",")]
        if len(servers) != 4:
            parser.error("--replica-urls needs 4 URLs")
    else:
        t0 = time.monotonic()
        servers = start_servers(
            4, model_dir=model_dir, log_dir=log_dir, max_loras=2, max_cpu_loras=4,
            threads=args.threads,
        )  # fmt: skip
        print(f"4 vLLM servers ready in {time.monotonic() - t0:.0f} s", flush=True)
    worker_log = log_dir / "worker.log"
    worker = start_worker(queue, worker_log, concurrency=2)
    try:
        wait_worker_ready(worker_log)
        volume = var_dir / "adapter-volume"
        volume.mkdir()
        product = Product(servers, volume, model_dir)
        urls = {count: [s.base_url for s in servers[:count]] for count in (1, 4)}
        pollers = {count: Poller(urls[count], args.poll_ms / 1000) for count in (1, 4)}
        import requests

        bare_sessions = [requests.Session() for _ in servers]
        sources = var_dir / "sources"

        cases = ["product-1", "product-4", "bare-seq-1", "bare-seq-4", "bare-par-4"]
        results = {case: Series(case) for case in cases}
        served_recorded = {count: Series(f"product-{count} recorded") for count in (1, 4)}
        api_calls = Series("promotion API call")
        breakdowns: dict[int, list[dict]] = {1: [], 4: []}
        total = args.warmup + args.rounds
        for round_no in range(total):
            timed = round_no >= args.warmup
            order = cases[round_no % len(cases) :] + cases[: round_no % len(cases)]
            for case in order:
                tag = f"r{round_no:02d}{uuid.uuid4().hex[:4]}"
                files = write_adapter_dir(
                    sources / f"{case}-{tag}",
                    AdapterSpec(r=args.rank, seed=round_no * 10 + cases.index(case)),
                )
                if case.startswith("product"):
                    count = int(case[-1])
                    name = f"p{count}-{tag}"
                    version = product.approved_version(name, files)
                    t_before, t_returned, rollout_id = product.promote(f"bench-{count}", version)
                    wall_returned = time.time() - (time.perf_counter() - t_returned)
                    t_served = pollers[count].wait_served(name, product.failed_check(rollout_id))
                    rollout = wait_rollout(rollout_id)
                    if rollout.status != "succeeded":
                        raise RuntimeError(
                            f"rollout {rollout_id}: {rollout.status}: {rollout.error}"
                        )
                    if timed:
                        results[case].seconds.append(t_served - t_returned)
                        served_recorded[count].seconds.append(
                            rollout.finished_at.timestamp() - wall_returned
                        )
                        api_calls.seconds.append(t_returned - t_before)
                        breakdowns[count].append(breakdown(rollout, wall_returned))
                    product.retire_now(count, version)
                else:
                    count = int(case[-1])
                    parallel = case.startswith("bare-par")
                    name = f"b{count}-{tag}"
                    seconds = bare_sequence(
                        files, volume, name, urls[count], bare_sessions[:count], parallel
                    )
                    if timed:
                        results[case].seconds.append(seconds)
                    bare_cleanup(name, urls[count], bare_sessions[:count])
            state = "timed" if timed else "warm-up"
            print(
                f"round {round_no + 1}/{total} ({state}): "
                + "  ".join(f"{c} {results[c].seconds[-1] * 1000:.0f}ms" for c in cases if timed),
                flush=True,
            )
        report(args, broker, results, served_recorded, api_calls, breakdowns)
    except BaseException:
        args.keep = True  # the worker log and the database say what happened
        raise
    finally:
        stop_process(worker)
        stop_all()
        if args.keep:
            print(f"kept {var_dir}")
        else:
            shutil.rmtree(var_dir, ignore_errors=True)
    return 0


def report(args, broker, results, served_recorded, api_calls, breakdowns) -> None:
    ms = lambda s: f"{s * 1000:7.0f}"  # noqa: E731
    print()
    print(
        f"promote-to-served, {args.rounds} timed rounds (+{args.warmup} warm-up), "
        f"adapter r={args.rank} q_proj+v_proj on tiny-llama, broker "
        f"{broker.split('://')[0]}, poll every {args.poll_ms:g} ms"
    )
    print(f"{'case':<38}{'median ms':>10}{'p95 ms':>10}")
    labels = {
        "product-1": "product, 1 replica",
        "product-4": "product, 4 replicas",
        "bare-seq-1": "bare, 1 replica",
        "bare-seq-4": "bare, 4 replicas, sequential",
        "bare-par-4": "bare, 4 replicas, parallel",
    }
    for case, series in results.items():
        print(f"{labels[case]:<38}{ms(series.median):>10}{ms(series.p95):>10}")
    for count, series in served_recorded.items():
        print(f"{f'product, {count}: rollout recorded succeeded':<38}"
              f"{ms(series.median):>10}{ms(series.p95):>10}")  # fmt: skip
    print(f"{'(promotion API call itself)':<38}{ms(api_calls.median):>10}{ms(api_calls.p95):>10}")
    print()
    p1, p4 = results["product-1"].median, results["product-4"].median
    b1, bs4, bp4 = (results[c].median for c in ("bare-seq-1", "bare-seq-4", "bare-par-4"))
    checks = [
        ("overhead, 1 replica (product/bare)", p1 / b1, 1.5),
        ("overhead, 4 replicas vs bare sequential", p4 / bs4, 1.5),
        ("overhead, 4 replicas vs bare parallel", p4 / bp4, 1.5),
        ("4 replicas / 1 replica (product)", p4 / p1, 1.3),
    ]
    for label, value, limit in checks:
        verdict = "met" if value <= limit else "MISSED"
        print(f"{label:<45}{value:6.2f}x  (target <= {limit}x: {verdict})")
    verdict = "met" if p4 < 0.5 else "MISSED"
    print(f"{'median on 4 replicas':<45}{p4 * 1000:6.0f} ms (target < 500 ms: {verdict})")
    print()
    print("where the product's time goes (median ms, from the rollout's own records)")
    keys = ["pickup", "stage", "load", "between", "verify", "record", "total"]
    print(f"{'replicas':<10}" + "".join(f"{k:>9}" for k in keys) + f"{'attempts':>10}")
    for count, rows in breakdowns.items():
        cells = "".join(f"{statistics.median(r[k] for r in rows) * 1000:9.0f}" for k in keys)
        attempts = statistics.median(r["attempts"] for r in rows)
        print(f"{count:<10}{cells}{attempts:10.0f}")
    print(
        "pickup: promotion API returned -> worker started the rollout; stage: -> first HTTP "
        "call; load: version/models/load calls; verify: models + one-token completion; "
        "record: last call -> rollout succeeded."
    )


if __name__ == "__main__":
    sys.exit(main())
