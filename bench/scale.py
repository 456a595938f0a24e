"""Reconcile at fleet scale, each figure beside the bare HTTP it needs, measured
in the same run.

    .venv/bin/python -m bench.scale [--database-url postgres://.../bench_scale]
        [--replicas 1,8,32] [--adapters 50,500] [--ticks 5] [--sections tick,heal]
        [--real 0]

tick  An in-sync reconcile tick (every replica already serves every adapter):
      wall time, SQL statements (everything the tick runs, the observability
      hook after it included), HTTP calls; beside it the bare sequence, GET
      /v1/models on every replica from the same number of threads.
heal  One replica that held every adapter restarts (vLLM forgets them all):
      the reconcile that puts them back; beside it the bare sequence, one POST
      /v1/load_lora_adapter per adapter, one after another and from
      SERVING_RECONCILE_PER_REPLICA threads.

Replicas are the vLLM stand-in (tests/support/vllm_standin.py: one asyncio
process, one port per replica, the contract checked against real vLLM by
tests/serving/vllm/test_standin_contract.py). Its latency model: zero by
default (no sleep per load or cold load), in the product's run and in the
bare baseline alike; --standin-load-seconds / --standin-cold-read-seconds set others,
and the output says which was used.
`--real N` (N <= 4) adds the same tick and heal on N real vLLM servers (CPU,
tiny model), to set the stand-in's ratios against.

Sections: tick, heal, real (with --real N) and promotions (bench/scale_promotions.py,
run in its own process); more plug in through SECTIONS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

SECTIONS: dict = {}
# The stand-in's sleeps (tests/support/vllm_standin.StandinReplica), from the options.
STANDIN: dict = {"latency": None}  # a StandinLatency; None: the stand-in's default (zero)


def section(name: str):
    def register(function):
        SECTIONS[name] = function
        return function

    return register


def _cpu(function):
    """(wall seconds, process CPU seconds, result) of one call. The stand-in
    serves from this process: its CPU is in both the product's and the bare run's."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def _bare_models(urls: list[str], metrics: bool = False) -> float:
    """GET /v1/models on every replica (and, with `metrics`, GET /metrics after
    it, as the observability hook does), from as many threads as the reconcile."""
    with requests.Session() as http:

        def get(url):
            http.get(f"{url}/v1/models", timeout=30).raise_for_status()
            if metrics:
                http.get(f"{url}/metrics", timeout=30).raise_for_status()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(urls)))) as pool:
            list(pool.map(get, urls))
        return time.perf_counter() - started


def _bare_loads(url: str, served: list, threads: int) -> float:
    local = threading.local()

    def load(s):
        http = getattr(local, "http", None) or requests.Session()
        local.http = http
        body = {"lora_name": s.adapter.served_name, "lora_path": s.served_path}
        http.post(f"{url}/v1/load_lora_adapter", json=body, timeout=60).raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(load, served))
    return time.perf_counter() - started


def _calls(fleet) -> int:
    # "completions:<model>" is a per-model tally of the calls "completions" counts.
    return sum(n for r in fleet.replicas for route, n in r.calls.items() if ":" not in route)


class _Ctx:
    def __init__(self, cast, options):
        self.cast, self.options = cast, options
        self.results: dict = {}
        from bench import results as bench_results

        self.out = bench_results.Results("scale", options)


@section("tick")
def tick_section(ctx: _Ctx) -> None:
    from bench.scale_support import deployment_for, median
    from serving.reconcile.tick import reconcile_deployment
    from tests.support.fleet import (
        fingerprints_record,
        measure,
        served_adapters_clone,
        standin_fleet,
        standin_load,
    )

    options = ctx.options
    print("\n== In-sync reconcile tick (stand-in replicas) ==")
    print(
        f"{'replicas':>8} {'adapters':>8} {'tick ms':>9} {'CPU ms':>7} {'bare ms':>9} "
        f"{'CPU ms':>7} {'bare+metrics':>12} {'SQL':>5} {'HTTP':>5} {'bare HTTP':>9}"
    )
    for replicas in options.replicas:
        with standin_fleet(replicas, **STANDIN) as fleet:
            deployment = deployment_for(ctx.cast, f"tick-{replicas}", fleet.urls)
            served: list = []
            for adapters in options.adapters:
                more = served_adapters_clone(
                    deployment,
                    ctx.cast.version,
                    adapters - len(served),
                    prefix=f"t{replicas}-a{adapters}",
                )
                served += more
                for replica in fleet.replicas:
                    standin_load(replica, more)
                fingerprints_record(deployment, more)
                for _ in range(2):  # first sight, then the new listings written once
                    reconcile_deployment(deployment.pk, "bench")
                walls, bares, bares_m, statements, calls = [], [], [], set(), set()
                cpus, bare_cpus = [], []
                for _ in range(options.ticks):
                    before = _calls(fleet)
                    _, cpu, m = _cpu(
                        lambda d=deployment: measure(lambda: reconcile_deployment(d.pk, "bench"))
                    )
                    cpus.append(cpu)
                    assert m.result.in_sync == replicas and not m.result.repairs, m.result
                    calls.add(_calls(fleet) - before)
                    if options.show_sql:
                        print(m.result)
                        print(*(s[:100] for s in m.sql), sep="\n")
                    walls.append(m.seconds)
                    statements.add(m.statements)
                    bare, bare_cpu, _ = _cpu(lambda: _bare_models(fleet.urls))
                    bares.append(bare)
                    bare_cpus.append(bare_cpu)
                    bares_m.append(_bare_models(fleet.urls, metrics=True))
                row = {
                    "tick_ms": median(walls) * 1000,
                    "tick_cpu_ms": median(cpus) * 1000,
                    "bare_ms": median(bares) * 1000,
                    "bare_cpu_ms": median(bare_cpus) * 1000,
                    "bare_metrics_ms": median(bares_m) * 1000,
                    "sql": max(statements),
                    "http": max(calls),
                    "bare_http": replicas,
                }
                ctx.results[("tick", replicas, adapters)] = row
                if "tick" not in ctx.out.tables:
                    ctx.out.table(
                        "tick",
                        ["replicas", "adapters", "tick ms", "tick CPU ms", "bare ms",
                         "bare CPU ms", "bare+metrics ms", "SQL", "HTTP", "bare HTTP"],
                        "in-sync reconcile tick (stand-in replicas)",
                    )  # fmt: skip
                ctx.out.tables["tick"].row(
                    replicas, adapters, row["tick_ms"], row["tick_cpu_ms"], row["bare_ms"],
                    row["bare_cpu_ms"], row["bare_metrics_ms"], row["sql"], row["http"],
                    row["bare_http"],
                )  # fmt: skip
                print(
                    f"{replicas:>8} {adapters:>8} {row['tick_ms']:>9.1f} "
                    f"{row['tick_cpu_ms']:>7.0f} {row['bare_ms']:>9.1f} "
                    f"{row['bare_cpu_ms']:>7.0f} {row['bare_metrics_ms']:>12.1f} "
                    f"{row['sql']:>5} {row['http']:>5} {row['bare_http']:>9}"
                )
    big = max((k for k in ctx.results if k[0] == "tick"), key=lambda k: (k[1] * k[2], k))
    row = ctx.results[big]
    met = row["tick_ms"] < 1000 and row["sql"] <= 10
    ctx.out.headline(
        f"in-sync reconcile tick, {big[1]} replicas × {big[2]} adapters",
        f"{row['tick_ms']:.0f} ms (CPU {row['tick_cpu_ms']:.0f} ms), {row['sql']} SQL",
        f"bare listing {row['bare_ms']:.0f} ms (CPU {row['bare_cpu_ms']:.0f} ms)",
        f"< 1 s, ≤ 10 SQL: {'met' if met else 'MISSED'}",
    )
    _growth(ctx)


def _growth(ctx: _Ctx) -> None:
    ticks = {k[1:]: v for k, v in ctx.results.items() if k[0] == "tick"}
    rs, adapters = ctx.options.replicas, ctx.options.adapters
    if len(adapters) > 1:
        lo, hi = adapters[0], adapters[-1]
        print(f"\nGrowth with adapters ({lo} -> {hi}, x{hi / lo:g}):")
        for r in rs:
            a, b = ticks[(r, lo)], ticks[(r, hi)]
            print(
                f"  {r:>3} replicas: tick x{b['tick_ms'] / a['tick_ms']:.2f} "
                f"(bare x{b['bare_ms'] / a['bare_ms']:.2f}), SQL {a['sql']} -> {b['sql']}"
            )
    if len(rs) > 1:
        lo, hi = rs[0], rs[-1]
        print(f"Growth with replicas ({lo} -> {hi}, x{hi / lo:g}):")
        for n in adapters:
            a, b = ticks[(lo, n)], ticks[(hi, n)]
            print(
                f"  {n:>3} adapters: tick x{b['tick_ms'] / a['tick_ms']:.2f} "
                f"(bare x{b['bare_ms'] / a['bare_ms']:.2f}), SQL {a['sql']} -> {b['sql']}, "
                f"HTTP {a['http']} -> {b['http']}"
            )


@section("heal")
def heal_section(ctx: _Ctx) -> None:
    from django.conf import settings

    from bench.scale_support import deployment_for
    from serving.reconcile.tick import reconcile_deployment
    from tests.support.fleet import (
        fingerprints_record,
        measure,
        served_adapters_clone,
        standin_fleet,
        standin_load,
    )

    adapters = max(ctx.options.adapters)
    replicas = ctx.options.heal_replicas
    print(f"\n== Heal: one of {replicas} replicas restarts, it held {adapters} adapters ==")
    with standin_fleet(replicas, **STANDIN) as fleet:
        deployment = deployment_for(ctx.cast, f"heal-{replicas}", fleet.urls)
        served = served_adapters_clone(deployment, ctx.cast.version, adapters, prefix="heal")
        for replica in fleet.replicas:
            standin_load(replica, served)
        fingerprints_record(deployment, served)
        for _ in range(2):
            reconcile_deployment(deployment.pk, "bench")
        victim = fleet.replicas[0]
        victim.restart()
        before = _calls(fleet)
        m = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
        http = _calls(fleet) - before
        assert len(victim.adapters) == adapters, len(victim.adapters)
        assert len(m.result.repairs) == adapters
        lanes = settings.SERVING_RECONCILE_PER_REPLICA
        victim.restart()
        sequential = _bare_loads(fleet.urls[0], served, 1)
        victim.restart()
        parallel = _bare_loads(fleet.urls[0], served, lanes)
        after = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
        print(
            f"  heal {m.seconds:.2f} s, {m.statements} SQL statements, {http} HTTP calls\n"
            f"  bare loads: {sequential:.2f} s one after another, "
            f"{parallel:.2f} s from {lanes} threads ({adapters} POSTs)\n"
            f"  the next tick: {after.seconds * 1000:.0f} ms, {after.statements} SQL"
        )
        ctx.out.table(
            "heal",
            ["replicas", "adapters", "heal s", "SQL", "HTTP", "bare sequential s",
             f"bare parallel ({lanes} threads) s"],
            "heal: one replica restarts (stand-in replicas)",
        ).row(replicas, adapters, m.seconds, m.statements, http, sequential, parallel)  # fmt: skip
        ctx.out.headline(
            f"heal a restarted replica holding {adapters} adapters",
            f"{m.seconds:.2f} s",
            f"{adapters} bare loads {sequential:.2f} s ({lanes} threads: {parallel:.2f} s)",
            f"< 10 s: {'met' if m.seconds < 10 else 'MISSED'}",
        )
        ctx.results["heal"] = {
            "seconds": m.seconds,
            "sql": m.statements,
            "http": http,
            "bare_sequential": sequential,
            "bare_parallel": parallel,
        }


@section("real")
def real_section(ctx: _Ctx) -> None:
    """The same tick and heal on real vLLM (1..4 servers), for the stand-in's ratios."""
    count = ctx.options.real
    if not count:
        return
    from bench.scale_support import deployment_for, median
    from serving.reconcile.tick import reconcile_deployment
    from tests.support.fleet import fingerprints_record, measure, served_adapters_clone
    from tests.support.vllm_servers import ensure_tiny_model, start_servers

    adapters = min(ctx.options.adapters)
    print(f"\n== Real vLLM: {count} servers x {adapters} adapters ==")
    ensure_tiny_model()
    servers = start_servers(count, max_loras=2, max_cpu_loras=adapters)
    try:
        urls = [s.base_url for s in servers]
        deployment = deployment_for(ctx.cast, f"real-{count}", urls)
        served = served_adapters_clone(deployment, ctx.cast.version, adapters, prefix="real")
        heal = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
        fingerprints_record(deployment, served)
        reconcile_deployment(deployment.pk, "bench")
        walls, bares, bares_m, sql = [], [], [], set()
        for _ in range(ctx.options.ticks):
            m = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
            walls.append(m.seconds)
            sql.add(m.statements)
            bares.append(_bare_models(urls))
            bares_m.append(_bare_models(urls, metrics=True))
        sequential = _bare_loads_after_restart(servers[0], served)
        print(
            f"  real:     tick {median(walls) * 1000:.1f} ms (bare {median(bares) * 1000:.1f} ms, "
            f"with /metrics {median(bares_m) * 1000:.1f} ms), "
            f"SQL {max(sql)}; {adapters} adapters onto {count} empty: {heal.seconds:.2f} s; "
            f"bare {adapters} loads on one, one after another: {sequential:.2f} s"
        )
    finally:
        for server in servers:
            server.stop()
    # The same on as many stand-in replicas, for the ratios.
    from tests.support.fleet import standin_fleet

    with standin_fleet(count, **STANDIN) as fleet:
        deployment = deployment_for(ctx.cast, f"real-standin-{count}", fleet.urls)
        served = served_adapters_clone(deployment, ctx.cast.version, adapters, prefix="rs")
        s_heal = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
        fingerprints_record(deployment, served)
        reconcile_deployment(deployment.pk, "bench")
        s_walls, s_bares, s_bares_m = [], [], []
        for _ in range(ctx.options.ticks):
            s_walls.append(measure(lambda: reconcile_deployment(deployment.pk, "bench")).seconds)
            s_bares.append(_bare_models(fleet.urls))
            s_bares_m.append(_bare_models(fleet.urls, metrics=True))
        fleet.replicas[0].restart()
        s_seq = _bare_loads(fleet.urls[0], served, 1)
    print(
        f"  stand-in: tick {median(s_walls) * 1000:.1f} ms (bare {median(s_bares) * 1000:.1f} ms, "
        f"with /metrics {median(s_bares_m) * 1000:.1f} ms); "
        f"{adapters} onto {count} empty: {s_heal.seconds:.2f} s; bare loads: {s_seq:.2f} s\n"
        f"  real / stand-in: tick x{median(walls) / median(s_walls):.2f}, "
        f"bare tick x{median(bares) / median(s_bares):.2f}, "
        f"bare with /metrics x{median(bares_m) / median(s_bares_m):.2f}, "
        f"first load x{heal.seconds / s_heal.seconds:.2f}, bare loads x{sequential / s_seq:.2f}"
    )


def _bare_loads_after_restart(server, served) -> float:
    for s in served:
        requests.post(
            f"{server.base_url}/v1/unload_lora_adapter",
            json={"lora_name": s.adapter.served_name},
            timeout=60,
        )
    return _bare_loads(server.base_url, served, 1)


@section("promotions")
def promotions(ctx) -> None:
    """100 promotions at once on 8 stand-in replicas, until all are served
    (bench/scale_promotions.py). In a process of its own: it sets Django up with
    its own VAR_DIR, broker queue and Celery worker, and a fresh database beside
    the one given."""
    print("\n== 100 promotions at once (bench.scale_promotions) ==", flush=True)
    env = dict(os.environ)
    if ctx.options.database_url:
        env["DATABASE_URL"] = ctx.options.database_url
    command = [sys.executable, "-m", "bench.scale_promotions"]
    latency = STANDIN["latency"]
    command += ["--standin-load-seconds", f"{latency.load_seconds:g}"]
    command += ["--standin-cold-read-seconds", f"{latency.cold_read_seconds:g}"]
    subprocess.run(command, env=env, check=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="")
    parser.add_argument("--replicas", type=_ints, default=[1, 8, 32])
    parser.add_argument("--adapters", type=_ints, default=[50, 500])
    parser.add_argument("--heal-replicas", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--real", type=int, default=0, choices=range(0, 5))
    parser.add_argument("--sections", default="tick,heal,real,promotions")
    parser.add_argument("--show-sql", action="store_true")
    parser.add_argument("--standin-load-seconds", type=float, default=0.0)
    parser.add_argument("--standin-cold-read-seconds", type=float, default=0.0)
    from bench import results as bench_results

    bench_results.add_arguments(parser)
    options = parser.parse_args(argv)
    if options.smoke:  # bench.scale_promotions has a smoke of its own
        options.replicas, options.adapters, options.heal_replicas = [1, 2], [5, 10], 2
        options.ticks, options.sections = 1, "tick,heal"
    from tests.support.vllm_standin import StandinLatency

    STANDIN["latency"] = StandinLatency(
        load_seconds=options.standin_load_seconds,
        cold_read_seconds=options.standin_cold_read_seconds,
    )

    from bench.scale_support import setup

    cast = setup("scale", options.database_url or None)
    from django.db import connection

    latency = (
        f"stand-in latency model: {STANDIN['latency'].load_seconds * 1000:g} ms per load, "
        f"{STANDIN['latency'].cold_read_seconds * 1000:g} ms per cold re-read"
        + (" (zero: no sleeps)" if STANDIN["latency"] == type(STANDIN["latency"])() else "")
        + ", in the product's run and the baseline alike"
    )
    print(f"database: {connection.vendor}; stand-in replicas; {latency}")
    ctx = _Ctx(cast, options)
    ctx.out.note(f"database {connection.vendor}; {latency}")
    # The machine is shared: what else ran shows in the load average.
    ctx.out.note(
        "load average at start (1, 5, 15 min): " + ", ".join(f"{v:.2f}" for v in os.getloadavg())
    )
    for name in options.sections.split(","):
        SECTIONS[name](ctx)
    ctx.out.note("load average at end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    ctx.out.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
