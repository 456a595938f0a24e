"""Promote-to-served on real vLLM replicas, beside the bare sequence.

    .venv/bin/python -m bench.promote_to_served                      # 15 rounds, SQLite broker
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 .venv/bin/python -m bench.promote_to_served

What is timed, each round with a NEW adapter (fresh served name, so no swap):

  product  from BEFORE the POST /api/v1/promotions/ (Bearer token, in-process API
           client) until a one-token completion with model=<served_name> answers
           200 on EVERY replica and the rollout is recorded succeeded (verified).
           In between: the real product path, i.e. the rollout enqueued on commit,
           a `celery worker` subprocess on the configured broker picks it up,
           stages the files (copy, sha256, fsync, rename), loads into every
           replica in parallel, verifies, records. Each replica is polled by its
           own thread.
  bare     what a person with shell access would do by hand, verifying as the
           product does: copy the adapter's files into a fresh folder, then on
           each replica `POST /v1/load_lora_adapter`, `GET /v1/models` (listed at
           that folder), and the fingerprint probe through the adapter and through
           the base model (serving/probe.py: they must differ). "sequential"
           goes replica after replica; "parallel" does the replicas at once (the
           stricter baseline on 4 replicas).

Replicas are real vLLM (no stand-in, so no latency model to choose).
--smoke: one replica (--replica-urls with one URL, or one server started
here), one timed round: proves the bench runs (tests/bench).
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

from bench import results as bench_results
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

SERVED_BASE = "tiny-llama"

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
    """Copy the files to a fresh folder, then on each replica load and verify as
    the product does (listing, adapter probe, base probe: bare_on_replica)."""
    t0 = time.perf_counter()
    folder = bare_copy(source, volume, name)

    def on_replica(index: int) -> None:
        bare_on_replica(sessions[index], urls[index], name, folder, base_name=SERVED_BASE)

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

    def __init__(self, servers, volume: Path, model_dir: Path, counts) -> None:
        super().__init__()
        self.deployments = {}
        for count in counts:
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
        help="1 or 4 comma-separated URLs of vLLM servers already running the tiny model "
        "(runtime LoRA on, --max-loras 2 --max-cpu-loras 4); default: start them here",
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # one replica, one timed round
        args.rounds, args.warmup = 1, 0
    existing = [url.strip() for url in args.replica_urls.split(",") if url.strip()]
    replicas = len(existing) or (1 if args.smoke else 4)
    if replicas not in (1, 4):
        parser.error("--replica-urls needs 1 or 4 URLs")
    counts = (1, 4) if replicas == 4 else (1,)

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
    if existing:
        servers = [_Existing(url) for url in existing]
    else:
        t0 = time.monotonic()
        servers = start_servers(
            replicas, model_dir=model_dir, log_dir=log_dir, max_loras=2, max_cpu_loras=4,
            threads=args.threads,
        )  # fmt: skip
        print(f"{replicas} vLLM server(s) ready in {time.monotonic() - t0:.0f} s", flush=True)
    worker_log = log_dir / "worker.log"
    worker = start_worker(queue, worker_log, concurrency=2)
    try:
        wait_worker_ready(worker_log)
        volume = var_dir / "adapter-volume"
        volume.mkdir()
        product = Product(servers, volume, model_dir, counts)
        urls = {count: [s.base_url for s in servers[:count]] for count in counts}
        pollers = {count: Poller(urls[count], args.poll_ms / 1000) for count in counts}
        import requests

        bare_sessions = [requests.Session() for _ in servers]
        sources = var_dir / "sources"

        cases = [f"product-{c}" for c in counts] + [f"bare-seq-{c}" for c in counts]
        if 4 in counts:
            cases.append("bare-par-4")
        results = {case: Series(case) for case in cases}
        answering = {count: Series(f"product-{count} answering") for count in counts}
        api_calls = Series("promotion API call")
        breakdowns: dict[int, list[dict]] = {count: [] for count in counts}
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
                count = int(case[-1])
                if case.startswith("product"):
                    name = f"p{count}-{tag}"
                    version = product.approved_version(name, files)
                    # The clock starts BEFORE the promotion POST: the API call is
                    # the product's work too (the bare sequence times all of its own).
                    t_before, t_returned, rollout_id = product.promote(f"bench-{count}", version)
                    wall_returned = time.time() - (time.perf_counter() - t_returned)
                    t_served = pollers[count].wait_served(name, product.failed_check(rollout_id))
                    rollout = wait_rollout(rollout_id)
                    if rollout.status != "succeeded":
                        raise RuntimeError(
                            f"rollout {rollout_id}: {rollout.status}: {rollout.error}"
                        )
                    # Served = answering on every replica AND verified and recorded
                    # succeeded: the bare baseline ends with its verification too.
                    t_recorded = t_returned + rollout.finished_at.timestamp() - wall_returned
                    if timed:
                        results[case].seconds.append(max(t_served, t_recorded) - t_before)
                        answering[count].seconds.append(t_served - t_before)
                        api_calls.seconds.append(t_returned - t_before)
                        breakdowns[count].append(breakdown(rollout, wall_returned))
                    product.retire_now(count, version)
                else:
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
        report(args, broker, results, answering, api_calls, breakdowns)
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


LABELS = {
    "product-1": "product, 1 replica",
    "product-4": "product, 4 replicas",
    "bare-seq-1": "bare, 1 replica",
    "bare-seq-4": "bare, 4 replicas, sequential",
    "bare-par-4": "bare, 4 replicas, parallel",
}


def report(args, broker, results, answering, api_calls, breakdowns) -> None:
    out = bench_results.Results("promote_to_served", args)
    ms = lambda s: f"{s * 1000:7.0f}"  # noqa: E731
    print()
    heading = (
        f"promote-to-served on real vLLM 0.32 (no stand-in), {args.rounds} timed rounds "
        f"(+{args.warmup} warm-up), adapter r={args.rank} q_proj+v_proj on tiny-llama, broker "
        f"{broker.split('://')[0]}, poll every {args.poll_ms:g} ms"
    )
    print(heading)
    out.note(heading)
    out.note(
        "product: from before the promotion POST until every replica answers through the "
        "adapter and the rollout is recorded succeeded (verified). bare: copy the files, then "
        "on each replica load and verify as the product does (/v1/models lists it at its "
        "folder, the fingerprint probe through it differs from the base model's)."
    )
    table = out.table("cases", ["case", "median ms", "p95 ms"], "promote-to-served")
    print(f"{'case':<44}{'median ms':>10}{'p95 ms':>10}")
    for case, series in results.items():
        print(f"{LABELS[case]:<44}{ms(series.median):>10}{ms(series.p95):>10}")
        table.row(LABELS[case], series.median * 1000, series.p95 * 1000)
    for count, series in answering.items():
        label = f"(product, {count}: POST -> answering, unverified)"
        print(f"{label:<44}{ms(series.median):>10}{ms(series.p95):>10}")
        table.row(label, series.median * 1000, series.p95 * 1000)
    label = "(promotion API call itself)"
    print(f"{label:<44}{ms(api_calls.median):>10}{ms(api_calls.p95):>10}")
    table.row(label, api_calls.median * 1000, api_calls.p95 * 1000)
    print()
    median = {case: series.median for case, series in results.items()}
    checks = [("overhead, 1 replica (product / bare)", median["product-1"] / median["bare-seq-1"])]
    if "product-4" in median:
        p4 = median["product-4"]
        checks += [
            ("overhead, 4 replicas vs bare parallel", p4 / median["bare-par-4"]),
            ("overhead, 4 replicas vs bare sequential", p4 / median["bare-seq-4"]),
        ]
    for label, value in checks:
        verdict = out.verdict(label, value, target="<= 1.5x", met=value <= 1.5)
        print(f"{label:<45}{value:6.2f}x  (target <= 1.5x: {verdict})")
    if "product-4" in median:
        value = median["product-4"] / median["product-1"]
        verdict = out.verdict("4 replicas / 1 replica (product)", value, target="<= 1.3x",
                              met=value <= 1.3)  # fmt: skip
        print(f"{'4 replicas / 1 replica (product)':<45}{value:6.2f}x  (target <= 1.3x: {verdict})")
        p4_ms = median["product-4"] * 1000
        verdict = out.verdict("median on 4 replicas", p4_ms, target="< 500 ms", met=p4_ms < 500,
                              unit="ms")  # fmt: skip
        print(f"{'median on 4 replicas':<45}{p4_ms:6.0f} ms (target < 500 ms: {verdict})")

    def state(ratio: float) -> str:
        return f"{'met' if ratio <= 1.5 else 'MISSED'} ({ratio:.2f}x)"

    for count in sorted(answering, reverse=True):
        product = median[f"product-{count}"]
        if count == 4:
            par, seq = median["bare-par-4"], median["bare-seq-4"]
            out.headline(
                "promotion → answering, verified, on 4 real vLLM replicas",
                f"{product * 1000:.0f} ms median",
                f"bare verified: sequential {seq * 1000:.0f} ms, parallel {par * 1000:.0f} ms",
                f"≤ 1.5× bare parallel: {state(product / par)}",
            )
        else:
            bare = median["bare-seq-1"]
            out.headline(
                "promotion → answering, verified, on 1 replica",
                f"{product * 1000:.0f} ms median",
                f"bare verified {bare * 1000:.0f} ms",
                f"≤ 1.5×: {state(product / bare)}",
            )
    print()
    print("where the product's time goes (median ms, from the rollout's own records)")
    keys = ["pickup", "stage", "load", "between", "verify", "record", "total"]
    where = out.table("breakdown", ["replicas", *keys, "attempts"], "where the product's time goes")
    print(f"{'replicas':<10}" + "".join(f"{k:>9}" for k in keys) + f"{'attempts':>10}")
    for count, rows in breakdowns.items():
        values = [statistics.median(r[k] for r in rows) * 1000 for k in keys]
        attempts = statistics.median(r["attempts"] for r in rows)
        print(f"{count:<10}" + "".join(f"{v:9.0f}" for v in values) + f"{attempts:10.0f}")
        where.row(count, *(round(v) for v in values), attempts)
    legend = (
        "pickup: promotion API returned -> worker started the rollout; stage: -> first HTTP "
        "call; load: version/models/load calls; verify: models + adapter and base probes; "
        "record: last call -> rollout succeeded."
    )
    print(legend)
    out.note(legend)
    out.write()


if __name__ == "__main__":
    sys.exit(main())
