"""Version swaps and rollbacks through the front door, under continuous traffic, on real vLLM.

    .venv/bin/python -m bench.swap_through_gateway [--swaps 10] [--replicas 2] [--smoke]
        [--replica-urls URL,URL --replica-logs LOG,LOG] [--json PATH]

One or two real vLLM 0.32 servers (CPU, tiny model) behind a real HAProxy front
door (serving/door/haproxy/): started by the bench, or running ones
(--replica-urls, with --replica-logs: each server's log file, where its access
log is read; served as "tiny-llama" with max_loras 2 and rank 16, as
scripts/vllm/serve.sh starts them by default). Clients keep sending one-token completions
with model=<served name> through it. Then, in one run:

  steady      no swap, before the swaps and again after them: the throughput
              the swaps are measured against (the mean of both);
  gateway     --swaps swaps v0 -> v(n), each followed by its rollback v(n) ->
              v0 (a reload too), each the product's way
              (serving/rollouts/engine.py): per replica, taken out at
              the front door (drained where another replica serves the adapter;
              where none does, the adapter's new requests HELD at the door while
              the replica finishes what it has and is drained), unload+load
              there, verified (listed from the new path and a completion through
              it), put back, the hold released; one replica at a time;
  no hold     (--replicas 1 only) --swaps swaps the same way without the hold,
              as before it existed: the swap's gap meets the clients;
  raw         the baseline: the same number of unload+load swaps on the same
              servers, clients calling a replica directly (no front door),
              as clients did before it existed.

Reported: failed requests in each phase (target 0 through the door); how long
the door held the requests it held (p50, p99, max, from HAProxy's log);
throughput inside the swap windows and over the whole swap phase, each against
steady state (target >= 0.9); and the requests that reached a replica without
the adapter, counted from vLLM's own access logs (404 on a completion) and from
HAProxy's log (requests it had to send again to another replica), target 0.

With --replicas 1 (a deployment of a single replica) there is no other replica
to drain to: the door holds the adapter's requests while the only replica swaps
in place (vLLM 0.32: unload then load under the same name). With --replicas 2
the adapter is on both, so each swap drains one while the other serves (no
hold), and a second part puts it on ONE replica: swaps made on the other first,
rollbacks by a switch of traffic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import results as bench_results
from bench.swap_under_traffic import NAME, Traffic
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from serving.replica_calls import RetryPolicy, ensure_loaded, verify_serving
from serving.vllm_client import VLLMClient
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import (
    held_ms,
    open_access,
    retried_requests,
    running_haproxy,
    vllm_404s,
)
from tests.support.vllm_servers import (
    ensure_tiny_model,
    ensure_vllm_installed,
    free_port,
    start_servers,
)

SERVED_BASE = "tiny-llama"
POLICY = RetryPolicy(deadline_seconds=30, base_delay=0.2, max_delay=2)


def _table(servers, loaded_path: str | None):
    loaded = {NAME: loaded_path} if loaded_path else {}
    return routing_table(
        deployment="bench",
        base_model=SERVED_BASE,
        replicas=[
            ReplicaView(id=i + 1, base_url=s.base_url, down=False, loaded=loaded)
            for i, s in enumerate(servers)
        ],
        served=[ServedView(NAME, loaded_path, held=False)] if loaded_path else [],
    )


STEPS: dict[str, list[float]] = {"take out": [], "swap": [], "verify": [], "ready": []}
# SERVING_DOOR_HOLD_SECONDS' default: the longest a request waits at the door.
HOLD_SECONDS = 20.0


def gateway_swap(door: HAProxyFrontDoor, servers, path: str, hold_seconds: float) -> None:
    """The product's swap behind a front door (serving.rollouts.engine._run: door_take_out,
    ensure_loaded, verify, door_ready, door_release), one replica at a time."""
    for index, server in enumerate(servers):
        name = f"r{index + 1}"
        started = time.monotonic()
        taken = door.take_out(NAME, name, timeout=60, hold_seconds=hold_seconds, owner="bench")
        assert not taken.busy, taken.changes
        drained = time.monotonic()
        with VLLMClient(server.base_url, timeout=60) as client:
            loaded = ensure_loaded(client, NAME, path, POLICY)
            assert loaded.ok, loaded.error
            swapped = time.monotonic()
            verified = verify_serving(client, NAME, path, POLICY, with_completion=True)
            assert verified.ok, verified.error
        checked = time.monotonic()
        door.ready(NAME, name)
        if taken.held:
            door.release(NAME, owner=taken.owner)
        for step, seconds in zip(
            STEPS,
            (drained - started, swapped - drained, checked - swapped, time.monotonic() - checked),
            strict=True,
        ):
            STEPS[step].append(seconds)


def swap_phase(door, servers, paths, swaps: int, pause: float, hold_seconds: float, rollbacks):
    """`swaps` swaps v0 -> v(n) (and, with `rollbacks`, each one's rollback to
    v0): each swap's window, the second before it, and its seconds."""
    windows, before, durations = [], [], []
    phase_start = time.monotonic()
    for n in range(1, swaps + 1):
        for path in [paths[n], paths[0]] if rollbacks else [paths[n] if n % 2 else paths[0]]:
            started = time.monotonic()
            # The same run's baseline, under the same load: the seconds just
            # before each swap (this machine's load swings a lot over minutes).
            before.append((max(started - pause, phase_start), started))
            gateway_swap(door, servers, path, hold_seconds)
            ended = time.monotonic()
            durations.append(ended - started)
            windows.append((started, max(ended, started + 0.25)))
            time.sleep(pause)
    return windows, before, durations, (phase_start, time.monotonic())


def _failures(traffic, windows) -> tuple[int, int, dict, list[float]]:
    """(failed requests, swaps that failed some, failed by status, each swap's
    gap: from its first failed request to its last)."""
    failed, failing, statuses, gaps = 0, 0, {}, []
    for start, end in windows:
        # A request that failed in the gap may end a moment after the swap did.
        failed_at = [r for r in traffic.results if start <= r[0] < end + 1 and not r[1]]
        failed += len(failed_at)
        failing += bool(failed_at)
        times = [r[0] for r in failed_at]
        gaps.append(max(times) - min(times) if times else 0.0)
        for r in failed_at:
            statuses[r[2]] = statuses.get(r[2], 0) + 1
    return failed, failing, statuses, gaps


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _serve_check(server, path: str) -> None:
    """What the product does before traffic goes to a replica: the load (a
    no-op where it is loaded from `path` already) and the verification."""
    with VLLMClient(server.base_url, timeout=60) as client:
        loaded = ensure_loaded(client, NAME, path, POLICY)
        assert loaded.ok, loaded.error
        verified = verify_serving(client, NAME, path, POLICY, with_completion=True)
        assert verified.ok, verified.error


def moved_phase(door: HAProxyFrontDoor, servers, paths, swaps: int, clients: int, pause: float):
    """An adapter placement holds on ONE of the two replicas. Each swap is made
    before break (serving/rules/kept_copies.py, swap_plan): the new
    version loaded and verified on the other replica, the traffic sent there,
    the old replica drained; it keeps the old version. Then rollbacks, each
    back to the version the other replica kept: verified there, a switch of
    traffic (ready there, drain here), no reload."""
    url = f"http://{door.listen}"
    # From both replicas serving to one: r2 drained (it stays so), then unloaded.
    door.drain(NAME, "r2", timeout=60, keep_one=True)
    with VLLMClient(servers[1].base_url, timeout=60) as client:
        client.unload_adapter(NAME)
    holder = 0
    with Traffic(url, clients, timeout=60) as traffic:
        time.sleep(1.0)
        started_phase = time.monotonic()

        def switch(path: str) -> float:
            """The other replica serves `path` (verified), then takes the traffic."""
            nonlocal holder
            other = 1 - holder
            started = time.monotonic()
            _serve_check(servers[other], path)
            door.ready(NAME, f"r{other + 1}")
            door.drain(NAME, f"r{holder + 1}", timeout=60)
            holder = other
            time.sleep(pause)
            return time.monotonic() - started - pause

        moves = [switch(new) for new in paths[:swaps]]
        # Back each time to the version the other replica kept, drained (the product
        # knows its path from its records; read here before the clock starts).
        switches = [switch(_root_on(servers[1 - holder])) for _ in range(max(1, min(swaps, 5)))]
        phase = [(started_phase, time.monotonic())]
    _, _, rps = traffic.count(phase)
    return {
        "moves": len(moves),
        "rollbacks": len(switches),
        "requests": len(traffic.results),
        "failed": sum(1 for r in traffic.results if not r[1]),
        "rps": round(rps, 2),
        "move_seconds_median": round(statistics.median(moves), 3),
        "rollback_switch_ms_median": round(statistics.median(switches) * 1000, 1),
        "rollback_switch_ms_max": round(max(switches) * 1000, 1),
    }


def _root_on(server) -> str:
    """The path the adapter is loaded from on `server` (its /v1/models)."""
    with VLLMClient(server.base_url, timeout=60) as client:
        listing = client.list_models()
    from serving.vllm_client import model_cards

    [card] = [c for c in model_cards(listing) if c.id == NAME]
    return card.root


def raw_swap(server, path: str) -> None:
    with VLLMClient(server.base_url, timeout=60) as client:
        client.unload_adapter(NAME)
        loaded = client.load_adapter(NAME, path)
        assert loaded.ok, loaded.error


@dataclass
class RunningServer:
    """A vLLM server the bench did not start (--replica-urls): left running."""

    base_url: str
    log_path: Path

    def stop(self) -> None:
        pass


def run(
    swaps: int,
    clients: int,
    steady_seconds: float,
    pause: float,
    work: Path,
    replicas: int = 2,
    running: list[RunningServer] | None = None,
) -> dict:
    paths = [
        str(write_adapter_dir(work / f"v{n}", AdapterSpec(seed=n + 1))) for n in range(swaps + 1)
    ]
    if running:
        servers = running[:replicas]
    else:
        ensure_vllm_installed()
        servers = start_servers(
            replicas,
            names=["bench-a", "bench-b"][:replicas],
            model_dir=ensure_tiny_model(),
            served_name=SERVED_BASE,
            max_loras=2,
            max_cpu_loras=4,
            max_lora_rank=16,
            log_dir=work / "logs",
            timeout=300,
        )
    door = HAProxyFrontDoor(
        work / "gateway", listen=f"127.0.0.1:{free_port()}", hold_seconds=HOLD_SECONDS
    )
    log = work / "haproxy.log"
    unheld = None
    try:
        for server in servers:
            raw_swap(server, paths[0])
        door.write(_table(servers, paths[0]))
        with running_haproxy(door, log=log, access=open_access()):
            url = f"http://{door.listen}"
            offsets = [s.log_path.stat().st_size for s in servers]
            with Traffic(url, clients, timeout=60) as traffic:
                time.sleep(1.0)  # warm up
                steady_start = time.monotonic()
                time.sleep(steady_seconds)
                steady = [(steady_start, time.monotonic())]
                windows, before, durations, phase = swap_phase(
                    door, servers, paths, swaps, pause, HOLD_SECONDS, rollbacks=True
                )
                # Steady state again after the swaps, so that the baseline is the
                # mean of before and after (A-B-A): this machine's load drifts over
                # the minutes a run takes, and one side alone measured the drift.
                steady_again = time.monotonic()
                time.sleep(steady_seconds)
                steady.append((steady_again, time.monotonic()))
                held = held_ms(log, NAME)
                misrouted = sum(
                    vllm_404s(s.log_path, o) for s, o in zip(servers, offsets, strict=True)
                )
                retried = retried_requests(log)
                unheld_start = time.monotonic()
                if replicas == 1:
                    # As before the hold: the swap's gap meets the clients.
                    since = log.stat().st_size
                    unheld_windows, _, unheld_durations, _ = swap_phase(
                        door, servers, paths, swaps, pause, 0, rollbacks=False
                    )
                    unheld = (unheld_windows, unheld_durations, held_ms(log, NAME, since))
            moved = None
            if replicas == 2:
                offsets = [s.log_path.stat().st_size for s in servers]
                moved = moved_phase(door, servers, paths, swaps, clients, pause)
                moved["misrouted_vllm_404"] = sum(
                    vllm_404s(s.log_path, o) for s, o in zip(servers, offsets, strict=True)
                )
                moved["retried_by_haproxy"] = retried_requests(log) - retried
        steady_n, steady_failed, steady_rps = traffic.count(steady)
        swap_n, swap_failed, swap_rps = traffic.count(windows)
        phase_n, phase_failed, phase_rps = traffic.count([phase])
        _, _, before_rps = traffic.count(before[1:] or before)
        # Swap by swap: its window against the second before it (long swaps, whose
        # verification queued behind the machine's other work, weigh no more).
        per_swap = [
            traffic.count([w])[2] / traffic.count([b])[2]
            for w, b in zip(windows, before, strict=True)
            if traffic.count([b])[0]  # the first swap has no second before it
        ] or [0.0]
        _, failing_swaps, statuses, gaps = _failures(traffic, windows)
        # Every failure before the phase without the hold (steady states included).
        failed_total = sum(1 for r in traffic.results if not r[1] and r[0] < unheld_start)
        no_hold = None
        if unheld:
            failed, failing, by_status, unheld_gaps = _failures(traffic, unheld[0])
            no_hold = {
                "swaps": len(unheld[0]),
                "failed": failed,
                "failed_per_swap": round(failed / len(unheld[0]), 2),
                "swaps_that_failed_requests": failing,
                "failed_by_status": by_status,
                "gap_seconds_median": round(statistics.median(unheld_gaps), 3),
                "gap_seconds_max": round(max(unheld_gaps), 3),
                "held_requests": len(unheld[2]),
                "swap_seconds_median": round(statistics.median(unheld[1]), 3),
            }

        # Baseline: unload+load on the same servers, clients on a replica directly.
        raw_windows = []
        with Traffic(servers[0].base_url, clients, timeout=60) as direct:
            time.sleep(1.0)
            for n in range(swaps):
                started = time.monotonic()
                raw_swap(servers[0], paths[n % len(paths)])
                raw_windows.append((started, max(time.monotonic(), started + 0.25)))
                time.sleep(pause)
        raw_failed = sum(1 for r in direct.results if not r[1])
        raw_n, _, raw_rps = direct.count(raw_windows)
    finally:
        for server in servers:
            server.stop()
    # Each swap and rollback of the gateway phase, steps summed per replica.
    per_replica = [sum(STEPS[k][i] for k in STEPS) for i in range(len(windows) * replicas)]
    return {
        "swaps": swaps,
        "rollbacks": swaps,
        "clients": clients,
        "replicas": replicas,
        "hold_seconds": HOLD_SECONDS,
        "steady": {
            "requests": steady_n,
            "failed": steady_failed,
            "rps": round(steady_rps, 2),
            "rps_before_swaps": round(traffic.count(steady[:1])[2], 2),
            "rps_after_swaps": round(traffic.count(steady[1:])[2], 2),
        },
        "gateway": {
            "requests": sum(1 for r in traffic.results if r[0] < unheld_start),
            "failed": failed_total,
            "failed_in_swap_windows": swap_failed,
            "failed_by_status": statuses,
            "swaps_that_failed_requests": failing_swaps,
            "gap_seconds_median": round(statistics.median(gaps), 3),
            "gap_seconds_max": round(max(gaps), 3),
            "held_requests": len(held),
            "held_ms_p50": _percentile(held, 0.5),
            "held_ms_p99": _percentile(held, 0.99),
            "held_ms_max": max(held, default=0),
            "rps_in_swap_windows": round(swap_rps, 2),
            "rps_over_swap_phase": round(phase_rps, 2),
            "ratio_in_swap_windows": round(swap_rps / max(steady_rps, 1e-9), 3),
            "ratio_over_swap_phase": round(phase_rps / max(steady_rps, 1e-9), 3),
            "rps_just_before_swaps": round(before_rps, 2),
            "ratio_to_just_before": round(swap_rps / max(before_rps, 1e-9), 3),
            "ratio_per_swap_median": round(statistics.median(per_swap), 3),
            "ratio_per_swap_min": round(min(per_swap), 3),
            "swap_seconds_median": round(statistics.median(durations), 3),
            "swap_seconds_max": round(max(durations), 3),
            # Per replica: each step's median seconds.
            "step_seconds_median": {
                k: round(statistics.median(v[: len(windows) * replicas]), 3)
                for k, v in STEPS.items()
            },
            "step_seconds_max": {
                k: round(max(v[: len(windows) * replicas]), 3) for k, v in STEPS.items()
            },
            "misrouted_vllm_404": misrouted,
            "retried_by_haproxy": retried,
            "requests_in_swap_phase": phase_n,
            "failed_in_swap_phase": phase_failed,
            "requests_in_swap_windows": swap_n,
        },
        "no_hold": no_hold,
        "moved": moved,
        "rollback_by_reload_ms_median": round(1000 * statistics.median(per_replica), 1),
        "raw_unload_load": {
            "requests": len(direct.results),
            "failed": raw_failed,
            "failed_per_swap": round(raw_failed / swaps, 2),
            "requests_in_swap_windows": raw_n,
            "rps_in_swap_windows": round(raw_rps, 2),
        },
    }


def _django(var_dir: Path) -> None:
    """The product's settings, no database: the swap reads its unload pacing
    (SERVING_UNLOAD_PACE_SECONDS, serving/replica_calls.py) from them."""
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_DEBUG", "true")
    os.environ.setdefault("VAR_DIR", str(var_dir))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--steady", type=float, default=8.0, help="seconds of steady state")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between swaps")
    parser.add_argument(
        "--replicas",
        type=int,
        choices=[1, 2],
        default=2,
        help="1: a single-replica deployment, where the door holds requests during a swap",
    )
    parser.add_argument(
        "--replica-urls", default="", help="running vLLM servers (else they are started)"
    )
    parser.add_argument(
        "--replica-logs", default="", help="with --replica-urls: each server's log file"
    )
    bench_results.add_arguments(parser)  # --smoke (2 swaps, short phases), --json PATH
    args = parser.parse_args()
    if args.smoke:
        args.swaps, args.steady, args.pause = 2, 3.0, 0.5
    urls = [url.strip() for url in args.replica_urls.split(",") if url.strip()]
    logs = [Path(log.strip()) for log in args.replica_logs.split(",") if log.strip()]
    if urls and (len(urls) < args.replicas or len(logs) != len(urls)):
        parser.error(f"--replica-urls needs {args.replicas} URLs and --replica-logs one log each")
    running = [RunningServer(url.rstrip("/"), log) for url, log in zip(urls, logs, strict=True)]
    with tempfile.TemporaryDirectory(prefix="swap-gateway-") as work:
        _django(Path(work))
        result = run(
            args.swaps, args.clients, args.steady, args.pause, Path(work), args.replicas, running
        )
    g, s, r = result["gateway"], result["steady"], result["raw_unload_load"]
    out = bench_results.Results("swap_through_gateway", args)
    n = result["replicas"]
    replicas = f"{n} real vLLM replica{'s' if n > 1 else ''}"
    count = f"{result['swaps']} swaps and {result['rollbacks']} rollbacks"
    out.note(
        f"{count}, {result['clients']} clients, {replicas} behind a real HAProxy; the "
        "baseline is raw unload+load on the same servers, clients on a replica directly"
    )
    if n == 1:
        out.note(
            "one replica: nothing to drain to, so the door holds the adapter's new requests "
            f"(at most {result['hold_seconds']:g} s each) while the replica swaps in place "
            "(vLLM 0.32: unload, then load under the same name)"
        )
    failures = out.table(
        "failures",
        ["path", "requests", "failed", "failed per swap", "reached a replica without it"],
        "failed requests during version swaps and rollbacks",
    )
    failures.row(
        "front door (take out: drain, or hold where alone; swap, verify, ready)",
        g["requests"],
        g["failed"],
        round(g["failed"] / (2 * result["swaps"]), 2),
        g["misrouted_vllm_404"] + g["retried_by_haproxy"],
    )
    u = result["no_hold"]
    if u is not None:
        failures.row(
            "front door without the hold (swap in place, as before)",
            "",
            u["failed"],
            u["failed_per_swap"],
            "",
        )
    failures.row(
        "raw unload+load", r["requests"], r["failed"], r["failed_per_swap"], "(each failure)"
    )
    held = out.table(
        "held",
        ["measure", "value"],
        "requests the door held while a swap ran (from HAProxy's log)",
    )
    held.row("requests held", g["held_requests"])
    held.row("held, p50 ms", g["held_ms_p50"])
    held.row("held, p99 ms", g["held_ms_p99"])
    held.row("held, max ms", g["held_ms_max"])
    throughput = out.table(
        "throughput",
        ["measure", "req/s", "ratio"],
        "throughput during swaps against steady state (target >= 0.9)",
    )
    throughput.row("steady state (before and after the swaps)", s["rps"], 1.0)
    throughput.row("  steady before the swaps", s["rps_before_swaps"], "")
    throughput.row("  steady after the swaps", s["rps_after_swaps"], "")
    throughput.row("inside the swap windows", g["rps_in_swap_windows"], g["ratio_in_swap_windows"])
    throughput.row("the second before each swap", g["rps_just_before_swaps"], 1.0)
    throughput.row(
        "inside the swap windows / second before", g["rps_in_swap_windows"],
        g["ratio_to_just_before"],
    )  # fmt: skip
    throughput.row("swap by swap, median", "", g["ratio_per_swap_median"])
    throughput.row("whole swap phase", g["rps_over_swap_phase"], g["ratio_over_swap_phase"])
    if u is not None:
        gap = out.table(
            "gap",
            ["measure", "with the hold", "without"],
            "a swap in place on a single replica, through the front door",
        )
        gap.row(
            "swaps that failed requests",
            f"{g['swaps_that_failed_requests']} of {2 * result['swaps']}",
            f"{u['swaps_that_failed_requests']} of {u['swaps']}",
        )
        gap.row(
            "failed requests per swap",
            round(g["failed"] / (2 * result["swaps"]), 2),
            u["failed_per_swap"],
        )
        gap.row("failed, by status", json.dumps(g["failed_by_status"]),
                json.dumps(u["failed_by_status"]))  # fmt: skip
        gap.row("gap (first to last failure), max s", g["gap_seconds_max"], u["gap_seconds_max"])
        gap.row("swap, median s", g["swap_seconds_median"], u["swap_seconds_median"])
    steps = out.table("steps", ["step", "median s", "max s"], "each step of a swap, per replica")
    for step, median in g["step_seconds_median"].items():
        steps.row(step, median, g["step_seconds_max"][step])
    m = result["moved"]
    if m is not None:
        made = out.table(
            "make_before_break",
            ["measure", "value"],
            "an adapter on ONE of the two replicas: swaps made on the other first, "
            "rollbacks by a switch of traffic",
        )
        made.row("swaps (new version on the other replica, then the traffic)", m["moves"])
        made.row("failed requests", f"{m['failed']} of {m['requests']}")
        made.row("reached a replica without it", m["misrouted_vllm_404"] + m["retried_by_haproxy"])
        made.row("swap, median s", m["move_seconds_median"])
        made.row("rollback by switch (verify, ready, drain), median ms",
                 m["rollback_switch_ms_median"])  # fmt: skip
        made.row("rollback by switch, max ms", m["rollback_switch_ms_max"])
        made.row("baseline: rollback by reload on one replica (drain, unload+load, verify, "
                 "ready), median ms", result["rollback_by_reload_ms_median"])  # fmt: skip
        out.verdict("failed requests, adapter on one of two replicas", m["failed"],
                    target="0", met=m["failed"] == 0, unit="")  # fmt: skip
        out.verdict("rollback by a switch of traffic", m["rollback_switch_ms_max"],
                    target="< 1000", met=m["rollback_switch_ms_max"] < 1000,
                    unit="ms")  # fmt: skip
    out.verdict("failed requests through the front door", g["failed"], target="0",
                met=g["failed"] == 0, unit="")  # fmt: skip
    out.verdict("throughput in swap windows vs steady", g["ratio_in_swap_windows"],
                target=">= 0.9", met=g["ratio_in_swap_windows"] >= 0.9)  # fmt: skip
    out.verdict("requests that reached a replica without the adapter",
                g["misrouted_vllm_404"] + g["retried_by_haproxy"], target="0",
                met=g["misrouted_vllm_404"] + g["retried_by_haproxy"] == 0, unit="")  # fmt: skip
    if n == 1:
        out.verdict("the longest hold", g["held_ms_max"], target=f"< {result['hold_seconds']:g} s",
                    met=g["held_ms_max"] < result["hold_seconds"] * 1000, unit="ms")  # fmt: skip
    held_note = (
        f"; held p50 {g['held_ms_p50']:.0f} ms, max {g['held_ms_max']:.0f} ms"
        if g["held_requests"]
        else ""
    )
    out.headline(
        f"version swap under traffic through the front door ({n} replica{'s' if n > 1 else ''})",
        f"{g['failed']} failed requests in {count}{held_note}; throughput "
        f"{g['ratio_in_swap_windows']}× steady ({g['ratio_to_just_before']}× the second before)",
        f"raw unload+load: {r['failed_per_swap']} per swap"
        + (f"; without the hold: {u['failed_per_swap']} per swap" if u else ""),
        f"0: {'met' if g['failed'] == 0 else 'not met'}; ≥ 0.9×: "
        f"{'met' if g['ratio_in_swap_windows'] >= 0.9 else 'MISSED'}",
    )
    if m is not None:
        switched = m["rollback_switch_ms_max"] < 1000 and m["failed"] == 0
        out.headline(
            "rollback after a swap through the front door (adapter on 1 of 2 replicas)",
            f"a switch of traffic: {m['rollback_switch_ms_median']:.0f} ms median, "
            f"{m['rollback_switch_ms_max']:.0f} ms max; {m['failed']} failed",
            f"by reload: {result['rollback_by_reload_ms_median']:.0f} ms",
            f"< 1 s, no reload: {'met' if switched else 'MISSED'}",
        )
    print(f"{count}, {result['clients']} clients, {replicas}")
    print(f"  steady state through the front door: {s['rps']} req/s, {s['failed']} failed")
    print(
        f"  through the front door: {g['failed']} failed of {g['requests']}; "
        f"swap {g['swap_seconds_median']} s median, {g['swap_seconds_max']} s max; "
        f"{g['held_requests']} held, p50 {g['held_ms_p50']} ms, p99 {g['held_ms_p99']} ms, "
        f"max {g['held_ms_max']} ms"
    )
    print(
        f"    throughput in the swap windows = {g['ratio_in_swap_windows']} x steady "
        f"(target >= 0.9); against the second before each swap {g['ratio_to_just_before']} x; "
        f"swap by swap median {g['ratio_per_swap_median']} x"
    )
    print(
        f"    reached a replica without the adapter: {g['misrouted_vllm_404']} (vLLM logs), "
        f"{g['retried_by_haproxy']} retried by HAProxy (target 0)"
    )
    if u is not None:
        print(
            f"  without the hold (as before): {u['failed']} failed in {u['swaps']} swaps "
            f"({u['failed_per_swap']} per swap, {u['failed_by_status']}); gap max "
            f"{u['gap_seconds_max']} s"
        )
    print(
        f"  baseline, raw unload+load, clients on the replica: {r['failed']} failed of "
        f"{r['requests']} ({r['failed_per_swap']} per swap)"
    )
    if m is not None:
        print(
            f"  adapter on one of two replicas, made before break: {m['failed']} failed of "
            f"{m['requests']} in {m['moves']} swaps; rollback by switch median "
            f"{m['rollback_switch_ms_median']} ms, max {m['rollback_switch_ms_max']} ms "
            f"(by reload: {result['rollback_by_reload_ms_median']} ms median)"
        )
    print(json.dumps(result))
    out.write()


if __name__ == "__main__":
    main()
