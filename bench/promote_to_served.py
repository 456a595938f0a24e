"""Promotion -> answering through the front door, on real vLLM, beside the bare calls.

    .venv/bin/python -m bench.promote_to_served                      # 15 rounds, SQLite broker
    .venv/bin/python -m bench.promote_to_served --four standin       # 4 replicas: stand-ins
    CELERY_BROKER_URL=redis://127.0.0.1:6379/11 .venv/bin/python -m bench.promote_to_served

Each deployment (1 replica, 4 replicas) has its own real HAProxy front door
(serving/door/haproxy/), started as the tests start it. What is timed,
each round with a NEW adapter (fresh served name, so no swap):

  product  from BEFORE the POST /api/v1/promotions/ (Bearer token, in-process API
           client) until a one-token completion with model=<served_name> answers
           200 THROUGH THE FRONT DOOR and the rollout is recorded succeeded. In
           between: the real product path, i.e. the rollout enqueued on commit,
           a `celery worker` subprocess on the configured broker picks it up,
           stages the files (copy, sha256, fsync, rename), loads into every
           replica in parallel, verifies, records, routes the door. The bench
           polls the door (an unknown model is the door's own 404: the poll
           costs vLLM nothing until the route exists).
  bare     the same work by hand: copy the adapter's files into a fresh folder,
           then on each replica `POST /v1/load_lora_adapter`, `GET /v1/models`
           (listed at that folder), and the fingerprint probe through the adapter
           and through the base model (serving/rules/probe.py: they must differ); then
           the door's route at its runtime API (a free backend's servers ready,
           the map entry) and one completion through the door. "sequential" goes
           replica after replica; "parallel" does the replicas at once (the
           stricter baseline on 4 replicas).

The 1-replica deployment is one real vLLM 0.32 server. The 4-replica one is
four real servers (`--four vllm`, the default) or four vLLM stand-ins in
their own process (`--four standin`, tests/support/vllm_standin.py, contract
in docs/vllm-standin.md), for 2 cores fit one real server better than five.
--smoke: one replica (--replica-urls with one URL, or one server started
here), one timed round: proves the bench runs (tests/bench). The order of
cases rotates every round. The rollout's own records (started_at, every HTTP
attempt, finished_at) say where the product's time goes; the load average is
printed with every figure (the host is shared).

Everything lives in a throwaway VAR_DIR (SQLite, artifacts, adapter volume,
the embedded SQLite broker, the doors' files) unless DATABASE_URL is set; the
Celery queue has a unique name, so a shared Redis is safe.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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


def load_average() -> float:
    return os.getloadavg()[0]


# -- the front door --------------------------------------------------------------------


class Poller:
    """Sends a one-token completion through the door until it answers 200."""

    def __init__(self, door_url: str, interval: float) -> None:
        import requests

        self.url = door_url
        self.interval = interval
        self.session = requests.Session()

    def wait_served(self, name: str, failed, timeout: float = 120) -> float:
        """The perf_counter time of the door's first 200 for `name`. `failed()`
        is polled too, so a failed rollout stops the wait at once."""
        body = {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        self.session.close()  # a new connection each round, as the bare sequence's
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline and not failed():
            response = self.session.post(self.url + "/v1/completions", json=body, timeout=30)
            if response.status_code == 200:
                return time.perf_counter()
            time.sleep(self.interval)
        raise TimeoutError(f"{name} never answered through {self.url}")


class BareRoute:
    """The door's route by hand, at HAProxy's runtime API: what the product's
    route step amounts to for a new adapter (`set weight` and `set server` of a
    free backend's servers, then `add map`). Always the LAST free backend, which
    the product, taking the lowest free one that never counted a request,
    leaves alone."""

    def __init__(self, door, servers: list[str]) -> None:
        from serving.door.haproxy.maps import SLOT_PREFIX

        self.door = door
        self.servers = servers
        self.slot = f"{SLOT_PREFIX}{door.slots - 1}"

    def add(self, name: str) -> None:
        for server in self.servers:
            # As the product does it: a server rendered disabled has no weight.
            self._command(f"set weight {self.slot}/{server} 1")
            self._command(f"set server {self.slot}/{server} state ready")
        self._command(f"add map {self.door.map_path} {name} {self.slot}")

    def remove(self, name: str) -> None:
        # The product's door sync (a retire's, enqueued on commit) may rewrite
        # the map from its own table after this route was timed: then it is gone.
        answer = self.door.runtime.command(f"del map {self.door.map_path} {name}").strip()
        if answer and answer != "Key not found.":
            raise RuntimeError(f"bare: HAProxy answered 'del map ... {name}': {answer}")
        for server in self.servers:
            self._command(f"set server {self.slot}/{server} state maint")

    def _command(self, line: str) -> None:
        answer = self.door.runtime.command(line).strip()
        if answer:
            raise RuntimeError(f"bare: HAProxy answered {line!r}: {answer}")


def door_answers(door_url: str, name: str) -> None:
    """One completion through the door, on a new connection: one kept alive from
    before a reload of the door (the product's, when its free backends ran out)
    reaches the old worker, whose map is the old one."""
    import requests

    body = {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    answer = requests.post(door_url + "/v1/completions", json=body, timeout=30)
    if answer.status_code != 200:
        raise RuntimeError(f"bare: {name} through the door: {answer.status_code} {answer.text}")


def bare_sequence(
    source: Path, volume: Path, name: str, urls: list[str], sessions, parallel: bool, route
) -> float:
    """Copy the files to a fresh folder, on each replica load and verify as the
    product does (listing, adapter probe, base probe: bare_on_replica), route
    the door, and one completion through it."""
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
    route.add(name)
    door_answers(f"http://{route.door.listen}", name)
    return time.perf_counter() - t0


# -- the product -----------------------------------------------------------------------


class Product(Cast):
    """The cast, and deployments of 1 and 4 replicas, each behind its own door."""

    def __init__(self, urls: dict[int, list[str]], volume: Path, model_dir: Path) -> None:
        super().__init__()
        self.deployments = {
            count: self.deployment(
                f"bench-{count}",
                replica_urls,
                volume,
                model_dir,
                max_loras=2,
                max_cpu_loras=4,
                open_door=True,
            )  # fmt: skip
            for count, replica_urls in urls.items()
        }

    def failed_check(self, rollout_id: int):
        """A cheap callable for the poller: did the rollout end without success?
        Reads the database at most every 200 ms."""
        from serving.models import Rollout
        from serving.rules.transitions import ROLLOUT_TERMINAL

        state = {"at": 0.0, "failed": False}

        def failed() -> bool:
            now = time.monotonic()
            if now - state["at"] > 0.2:
                state["at"] = now
                status = Rollout.objects.values_list("status", flat=True).get(pk=rollout_id)
                state["failed"] = status in ROLLOUT_TERMINAL and status != "succeeded"
            return state["failed"]

        return failed

    def retire_now(self, count: int, version) -> None:
        done = wait_rollout(self.retire(self.deployments[count], version))
        if done.status != "succeeded":
            raise RuntimeError(f"retire rollout {done.pk}: {done.status} {done.error}")


@contextlib.contextmanager
def standins(count: int, log: Path):
    """`count` vLLM stand-ins in their own process (an event loop of their own,
    off this process's GIL): their URLs."""
    handle = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "tests.support.vllm_standin", "--replicas", str(count)],
        stdout=subprocess.PIPE, stderr=handle, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            raise RuntimeError(f"the stand-ins did not start; see {log}")
        yield json.loads(line)["urls"]
    finally:
        stop_process(process)
        handle.close()


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument(
        "--broker", default=None, help="Celery broker (default: $CELERY_BROKER_URL or SQLite)"
    )
    parser.add_argument(
        "--poll-ms", type=float, default=5.0,
        help="pause between the poller's requests through the door (the door's own 404 "
        "until the route exists: no cost to vLLM)",
    )  # fmt: skip
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the VAR_DIR and logs")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per vLLM server")
    parser.add_argument(
        "--four", choices=("vllm", "standin", "none"), default="vllm",
        help="the 4-replica deployment: four real vLLM servers, four stand-ins, or none",
    )  # fmt: skip
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
    if len(existing) not in (0, 1, 4):
        parser.error("--replica-urls needs 1 or 4 URLs")
    if (args.smoke or len(existing) == 1) and args.four == "vllm":
        args.four = "none"  # one real server: four real ones only if given or started here
    if len(existing) == 4:
        args.four = "vllm"
    counts = (1,) if args.four == "none" else (1, 4)

    from tests.support.vllm_servers import free_port

    var_dir = Path(tempfile.mkdtemp(prefix="bench-promote-"))
    configure_env(var_dir, args.broker)
    listen = {count: f"127.0.0.1:{free_port()}" for count in counts}
    # The worker (a subprocess) and this process drive the same doors.
    os.environ["SERVING_DOORS"] = ",".join(f"bench-{c}={a}" for c, a in listen.items())
    os.environ["SERVING_DOOR_DIR"] = str(var_dir / "gateways")

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from config.celery import app
    from serving.door.services import door_sync, front_door_for
    from serving.replica_rows import replicas_sync
    from tests.support.haproxy import running_haproxy
    from tests.support.vllm_servers import ensure_tiny_model, start_servers, stop_all

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    route_to_queue(app, queue)
    broker = settings.CELERY_BROKER_URL
    log_dir = var_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"VAR_DIR {var_dir}  broker {broker.split('@')[-1]}  queue {queue}", flush=True)

    call_command("migrate", verbosity=0)
    model_dir = ensure_tiny_model()
    worker = None
    with contextlib.ExitStack() as stack:
        try:
            if existing:
                real = existing
            else:
                t0 = time.monotonic()
                real_count = 4 if args.four == "vllm" else 1
                servers = start_servers(
                    real_count, model_dir=model_dir, log_dir=log_dir, max_loras=2,
                    max_cpu_loras=4, threads=args.threads,
                )  # fmt: skip
                real = [s.base_url for s in servers]
                print(f"{real_count} vLLM server(s) in {time.monotonic() - t0:.0f} s", flush=True)
            urls = {1: real[:1]}
            if args.four == "vllm":
                urls[4] = real[:4]
            elif args.four == "standin":
                urls[4] = stack.enter_context(standins(4, log_dir / "standins.log"))
            worker_log = log_dir / "worker.log"
            worker = start_worker(queue, worker_log, concurrency=2)
            wait_worker_ready(worker_log)
            volume = var_dir / "adapter-volume"
            volume.mkdir()
            product = Product(urls, volume, model_dir)
            doors, routes = {}, {}
            for count, deployment in product.deployments.items():
                door = front_door_for(deployment)
                assert door is not None
                # Its replicas' rows first: the configuration HAProxy starts with
                # has a server for each (else the first promotion reloads it).
                replicas_sync(deployment)
                door_sync(deployment)
                stack.enter_context(running_haproxy(door, log=log_dir / f"haproxy-{count}.log"))
                door_sync(deployment)  # who may call what (an open door)
                doors[count] = door
                servers_of = sorted(server for (b, server) in door.runtime.servers() if b == "base")
                assert len(servers_of) == count, servers_of
                routes[count] = BareRoute(door, servers_of)
            pollers = {c: Poller(f"http://{listen[c]}", args.poll_ms / 1000) for c in counts}
            run_rounds(args, product, urls, volume, var_dir, pollers, routes, counts, broker)
        except BaseException:
            args.keep = True  # the worker log and the database say what happened
            raise
        finally:
            if worker is not None:
                stop_process(worker)
            stop_all()
    if args.keep:
        print(f"kept {var_dir}")
    else:
        shutil.rmtree(var_dir, ignore_errors=True)
    return 0


def run_rounds(args, product, urls, volume, var_dir, pollers, routes, counts, broker) -> None:
    import requests

    from tests.support.adapters import AdapterSpec, write_adapter_dir

    bare_sessions = {count: [requests.Session() for _ in urls[count]] for count in counts}
    sources = var_dir / "sources"
    cases = [f"product-{c}" for c in counts] + [f"bare-seq-{c}" for c in counts]
    if 4 in counts:
        cases.append("bare-par-4")
    results = {case: Series(case) for case in cases}
    api_calls = Series("promotion API call")
    breakdowns: dict[int, list[dict]] = {count: [] for count in counts}
    loads: list[float] = []
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
                # The clock starts BEFORE the promotion POST: the API call is the
                # product's work too (the bare sequence times all of its own).
                t_before, t_returned, rollout_id = product.promote(f"bench-{count}", version)
                wall_returned = time.time() - (time.perf_counter() - t_returned)
                t_served = pollers[count].wait_served(name, product.failed_check(rollout_id))
                rollout = wait_rollout(rollout_id)
                if rollout.status != "succeeded":
                    raise RuntimeError(f"rollout {rollout_id}: {rollout.status}: {rollout.error}")
                t_recorded = t_returned + rollout.finished_at.timestamp() - wall_returned
                if timed:
                    results[case].seconds.append(max(t_served, t_recorded) - t_before)
                    api_calls.seconds.append(t_returned - t_before)
                    parts = breakdown(rollout, wall_returned)
                    parts["door"] = max(0.0, t_served - t_recorded)
                    parts["total"] = max(t_served, t_recorded) - t_returned
                    breakdowns[count].append(parts)
                product.retire_now(count, version)
            else:
                parallel = case.startswith("bare-par")
                name = f"b{count}-{tag}"
                sessions = bare_sessions[count]
                seconds = bare_sequence(
                    files, volume, name, urls[count], sessions, parallel, routes[count]
                )
                if timed:
                    results[case].seconds.append(seconds)
                routes[count].remove(name)
                bare_cleanup(name, urls[count], sessions)
        if timed:
            loads.append(load_average())
        state = "timed" if timed else "warm-up"
        print(
            f"round {round_no + 1}/{total} ({state}, load {load_average():.1f}): "
            + "  ".join(f"{c} {results[c].seconds[-1] * 1000:.0f}ms" for c in cases if timed),
            flush=True,
        )
    report(args, broker, results, api_calls, breakdowns, loads)


LABELS = {
    "product-1": "product, 1 replica",
    "product-4": "product, 4 replicas",
    "bare-seq-1": "bare, 1 replica",
    "bare-seq-4": "bare, 4 replicas, sequential",
    "bare-par-4": "bare, 4 replicas, parallel",
}


def report(args, broker, results, api_calls, breakdowns, loads) -> None:
    out = bench_results.Results("promote_to_served", args)
    ms = lambda s: f"{s * 1000:7.0f}"  # noqa: E731
    four = {"vllm": "4 real vLLM 0.32 servers", "standin": "4 vLLM stand-ins"}.get(args.four)
    load = (
        f"load average {min(loads):.1f} to {max(loads):.1f} (median {statistics.median(loads):.1f})"
    )
    print()
    heading = (
        f"promotion -> answering through a real HAProxy front door; 1 replica: real vLLM "
        f"0.32{f'; 4 replicas: {four}' if four else ''}. {args.rounds} timed rounds "
        f"(+{args.warmup} warm-up), adapter r={args.rank} q_proj+v_proj on tiny-llama, broker "
        f"{broker.split('://')[0]}, the door polled every {args.poll_ms:g} ms; {load}"
    )
    print(heading)
    out.note(heading)
    out.note(
        "product: from before the promotion POST until a completion through the front door "
        "answers 200 and the rollout is recorded succeeded (verified). bare: copy the files, "
        "on each replica load and verify as the product does (/v1/models lists it at its "
        "folder, the fingerprint probe through it differs from the base model's), then the "
        "door's route at its runtime API (a free backend's servers ready, the map entry) and "
        "one completion through the door."
    )
    table = out.table("cases", ["case", "median ms", "p95 ms"], "promotion -> answering")
    print(f"{'case':<44}{'median ms':>10}{'p95 ms':>10}")
    for case, series in results.items():
        print(f"{LABELS[case]:<44}{ms(series.median):>10}{ms(series.p95):>10}")
        table.row(LABELS[case], series.median * 1000, series.p95 * 1000)
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

    def state(ratio: float) -> str:
        return f"{'met' if ratio <= 1.5 else 'MISSED'} ({ratio:.2f}x)"

    at = f"load {statistics.median(loads):.1f}"
    for count in sorted(breakdowns, reverse=True):
        product = median[f"product-{count}"]
        if count == 4:
            par, seq = median["bare-par-4"], median["bare-seq-4"]
            out.headline(
                f"promotion → answering through the front door, {four}",
                f"{product * 1000:.0f} ms median ({at})",
                f"bare calls: sequential {seq * 1000:.0f} ms, parallel {par * 1000:.0f} ms",
                f"≤ 1.5× bare parallel: {state(product / par)}",
            )
        else:
            bare = median["bare-seq-1"]
            out.headline(
                "promotion → answering through the front door, 1 real vLLM replica",
                f"{product * 1000:.0f} ms median ({at})",
                f"bare calls {bare * 1000:.0f} ms",
                f"≤ 1.5×: {state(product / bare)}",
            )
    print()
    print("where the product's time goes (median ms, from the rollout's own records)")
    keys = ["pickup", "stage", "load", "between", "verify", "record", "door", "total"]
    where = out.table("breakdown", ["replicas", *keys, "attempts"], "where the product's time goes")
    print(f"{'replicas':<10}" + "".join(f"{k:>9}" for k in keys) + f"{'attempts':>10}")
    for count, rows in breakdowns.items():
        values = [statistics.median(r[k] for r in rows) * 1000 for k in keys]
        attempts = statistics.median(r["attempts"] for r in rows)
        print(f"{count:<10}" + "".join(f"{v:9.0f}" for v in values) + f"{attempts:10.0f}")
        where.row(count, *(round(v) for v in values), attempts)
    legend = (
        "pickup: promotion API returned -> worker started the rollout; stage: -> first HTTP "
        "call; load: version/metrics/load calls; verify: models + adapter and base probes; "
        "record: last call -> rollout succeeded; door: -> the door's first 200 (the route: "
        "the routing table read, the door's runtime changes; then the poller's next request); "
        "total: from the API's return."
    )
    print(legend)
    out.note(legend)
    out.write()


if __name__ == "__main__":
    sys.exit(main())
