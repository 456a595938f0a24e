"""What the front door costs a request, and how soon it routes a new adapter.

    .venv/bin/python -m bench.door_overhead [--requests 1000] [--clients 8]
        [--seconds 10] [--adapters 20] [--replica-urls URL] [--smoke] [--json PATH]

Two real HAProxy doors (serving/door/haproxy/) side by side in front of
one real vLLM 0.32 server (CPU, tiny model; --replica-urls to use a running
one), both with keys and grants on (a table of --keys inference keys, every
request carrying one):

  door alone  keys only: no request ids, no limits (the door before metering);
  metered     the door as the product runs it with metering and quotas on: the
              request id stamped with the caller's key and the version from a
              versions map, requests per minute counted per key and per
              department in the stick table (every key and department has a
              limit, set too high to trip), tokens per minute checked against
              the `limited` map (other callers refused in it; never the bench's).

The replica exports a span per request over OTLP (as the product runs it;
not in --smoke) to a sink in this process: the export is vLLM's, in a background thread after the
answer, so it is in every arm alike, the direct one too; the product's
receiver is not in a request's path. Metered tokens against vLLM's totals are
bench/metering.py (docs/figures.md, Metering). In one run:

  latency     one-token completions of an adapter, one at a time, in turn
              straight to the replica (the baseline), through the door alone
              and through the metered door (each round in another order):
              p50 and p99 of each, what the door adds to direct (target: at
              most 1 ms at p50) and what metering and quotas add to the door
              alone (target: at most 1 ms at p50). The same against a stand-in
              replica (answers in well under a millisecond), where the door's
              own cost is not lost in vLLM's noise;
  throughput  --clients clients as fast as they can for --seconds, direct,
              door alone and metered, in turn twice (A-B-C-A-B-C: the
              machine's load drifts), each door's ratio to direct (target
              >= 0.95);
  routed      --adapters new adapters, each loaded on the replica, then the
              rollout's last step (the door's sync with it in the table) and
              requests until the first 200: the seconds from the sync's start
              (p50, p99; target p99 < 1 s), on the metered door as the product
              runs it (a free slot, no reload) and, as the baseline, on a door
              without free slots (a reload per adapter, as before).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from bench import results as bench_results
from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from serving.rules.quotas import Limited
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import running_haproxy
from tests.support.vllm_servers import (
    VLLMServer,
    ensure_tiny_model,
    ensure_vllm_installed,
    free_port,
)
from tests.support.vllm_standin import running_fleet

SERVED_BASE = "tiny-llama"
ADAPTER = "legal-contracts"
KEY = "sk-bench-legal-0123456789"
# Set on every key and department, never reached: the limits are counted, not tripped.
HIGH_RPM = 1_000_000_000
# The three paths, in the tables' order.
PATHS = {"direct": "direct", "door": "door alone (keys only)",
         "metered": "door, metering and quotas on"}  # fmt: skip


def access(keys: int, models: list[str], *, metered: bool = False) -> DoorAccess:
    """--keys keys of five departments; the bench's own key is legal's (id 1).
    `metered`: the maps of metering and quotas too (module docstring)."""
    now = int(time.time())
    table = {
        hashlib.sha256(f"sk-other-{i}".encode()).hexdigest(): CallerKey(
            key_id=i + 2, department=f"dept-{i % 5}", expires_at=now + 86400
        )
        for i in range(keys)
    }
    table[hashlib.sha256(KEY.encode()).hexdigest()] = CallerKey(1, "legal", now + 86400)
    allowed = {("legal", m) for m in models} | {(f"dept-{i}", SERVED_BASE) for i in range(5)}
    if not metered:
        return DoorAccess(deployment="bench", keys=table, allowed=frozenset(allowed))
    departments = {key.department for key in table.values()}
    rpm = {f"key:{key.key_id}": HIGH_RPM for key in table.values()}
    rpm |= {f"dept:{slug}": HIGH_RPM for slug in departments}
    # Others over their tokens: a tenth of the keys and one department.
    limited = {
        f"key:{key.key_id}": Limited(now + 3600, "tokens_per_minute", 1000)
        for key in table.values()
        if key.key_id % 10 == 0
    }
    limited["dept:dept-4"] = Limited(now + 86400, "tokens_per_day", 100_000)
    versions = {model: index + 7 for index, model in enumerate(models) if model != SERVED_BASE}
    return DoorAccess(
        deployment="bench", keys=table, allowed=frozenset(allowed), versions=versions,
        rpm=rpm, limited=limited,
    )  # fmt: skip


class SpanSink(BaseHTTPRequestHandler):
    """Takes the replica's OTLP exports and drops them (the product's receiver
    is no part of a request's path); counts the batches."""

    batches = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).batches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def table_for(url: str, loaded: dict[str, str]):
    return routing_table(
        deployment="bench",
        base_model=SERVED_BASE,
        replicas=[ReplicaView(1, url, down=False, loaded=loaded)],
        served=[ServedView(name, path, held=False) for name, path in loaded.items()],
    )


def completion(session: requests.Session, url: str, model: str, key: str = "") -> int:
    return post_completion(session, url, model, key).status_code


def post_completion(session: requests.Session, url: str, model: str, key: str = ""):
    body = {"model": model, "prompt": "The contract says", "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return session.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latencies(arms: dict[str, tuple[str, str]], model: str, count: int) -> dict:
    """`count` requests per arm (name -> url, key), one at a time, a round of
    one each in turn, each round starting with the next arm (keep-alive all)."""
    names = list(arms)
    sessions = {name: requests.Session() for name in names}
    for _ in range(5):  # warm every path
        for name in names:
            completion(sessions[name], arms[name][0], model, arms[name][1])
    took: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(count):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            url, key = arms[name]
            started = time.perf_counter()
            assert completion(sessions[name], url, model, key) == 200, name
            took[name].append((time.perf_counter() - started) * 1000)
    p50 = {name: percentile(took[name], 0.5) for name in names}
    p99 = {name: percentile(took[name], 0.99) for name in names}
    return {"p50": p50, "p99": p99}


def saturate(url: str, model: str, clients: int, seconds: float, key: str = "") -> float:
    """Requests per second of `clients` clients sending back to back; every
    answer a 200 (a limit that tripped would be a figure of refusals)."""
    done, failed = [0] * clients, [0] * clients
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            if completion(session, url, model, key) == 200:
                done[index] += 1
            else:
                failed[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not sum(failed), f"{sum(failed)} requests to {url} failed"
    return sum(done) / seconds


def stamped(arms: dict[str, tuple[str, str]], model: str) -> None:
    """The metered door writes the request id vLLM answers with (`cmpl-<id>`);
    the door alone and direct do not: the arms are what they say."""
    ids = {name: post_completion(requests, url, model, key).json()["id"]
           for name, (url, key) in arms.items()}  # fmt: skip
    assert ids["metered"].startswith("cmpl-u1.k1.v7."), ids
    assert not any(".k1." in ids[name] for name in ("door", "direct")), ids


def routed_after(door: HAProxyFrontDoor, server_url: str, loaded: dict, count: int, tag: str,
                 keys: int):  # fmt: skip
    """Seconds from the door's sync (with `count` new adapters, one at a time)
    to the first 200 through it, each adapter loaded on the replica first. The
    sync is what the rollout's last step does (door_sync): the routes, then
    who may call them (the department's own new adapter)."""
    seconds = []
    url = f"http://{door.listen}"
    session = requests.Session()
    for index in range(count):
        name = f"{tag}-{index}"
        path = loaded[ADAPTER]
        load = {"lora_name": name, "lora_path": path}
        assert session.post(f"{server_url}/v1/load_lora_adapter", json=load, timeout=120).ok
        loaded[name] = path
        started = time.monotonic()
        door.apply(table_for(server_url, loaded))
        door.apply_access(access(keys, [SERVED_BASE, *loaded], metered=door.metering))
        while completion(session, url, name, KEY) != 200:
            assert time.monotonic() - started < 120, f"{name} not routed"
        seconds.append(time.monotonic() - started)
        session.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
        del loaded[name]
    return seconds


def doors(work: Path, url: str, loaded: dict, keys: int, tag: str) -> tuple:
    """The door alone and the metered door, configured (not yet running)."""
    models = [ADAPTER, SERVED_BASE]
    door = HAProxyFrontDoor(work / f"{tag}-door", listen=f"127.0.0.1:{free_port()}",
                            metering=False)  # fmt: skip
    metered = HAProxyFrontDoor(work / f"{tag}-metered", listen=f"127.0.0.1:{free_port()}")
    for each in (door, metered):
        each.write(table_for(url, loaded))
    return door, metered, access(keys, models), access(keys, models, metered=True)


def three_arms(work: Path, url: str, loaded: dict, keys: int, tag: str):
    """Both doors running: (name -> (url, key)), the metered door."""
    door, metered, plain, full = doors(work, url, loaded, keys, tag)
    stack = contextlib.ExitStack()
    stack.enter_context(running_haproxy(door, log=work / f"{tag}-door.log", access=plain))
    stack.enter_context(running_haproxy(metered, log=work / f"{tag}-metered.log", access=full))
    arms = {"direct": (url, ""), "door": (f"http://{door.listen}", KEY),
            "metered": (f"http://{metered.listen}", KEY)}  # fmt: skip
    return stack, arms, metered


def run(args, out: bench_results.Results) -> None:
    work = Path(tempfile.mkdtemp(prefix="door-overhead-"))
    server = sink = None
    if args.replica_urls:
        url = args.replica_urls.split(",")[0]
    else:
        ensure_vllm_installed()
        env = {}
        # Not in --smoke: vLLM starts about 15 s slower exporting spans (seen
        # here), and the export is in every arm alike, no part of either door.
        if not args.smoke:
            sink = ThreadingHTTPServer(("127.0.0.1", 0), SpanSink)
            threading.Thread(target=sink.serve_forever, daemon=True).start()
            env["SERVE_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{sink.server_port}/v1/traces"
        server = VLLMServer(
            name="door-bench", model_dir=ensure_tiny_model(), max_loras=2, max_cpu_loras=8,
            max_lora_rank=16, log_dir=work / "vllm", env=env,
        )  # fmt: skip
        server.start()
        server.wait_ready(timeout=300)
        url = server.base_url
    try:
        path = str(write_adapter_dir(work / "contracts", AdapterSpec(seed=1)))
        load = {"lora_name": ADAPTER, "lora_path": path}
        requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=60)
        assert requests.post(f"{url}/v1/load_lora_adapter", json=load, timeout=120).ok
        loaded = {ADAPTER: path}
        stack, arms, metered = three_arms(work, url, loaded, args.keys, "real")
        with stack:
            stamped(arms, ADAPTER)
            real = latencies(arms, ADAPTER, args.requests)
            rates = {name: [] for name in PATHS}
            for _ in range(2):
                for name in PATHS:
                    rates[name].append(saturate(arms[name][0], ADAPTER, args.clients,
                                                args.seconds, arms[name][1]))  # fmt: skip
            routed = routed_after(metered, url, loaded, args.adapters, "new", args.keys)
        # The baseline of the routing: a door without free slots reloads per adapter.
        bare = HAProxyFrontDoor(work / "bare", listen=f"127.0.0.1:{free_port()}", slots=0)
        bare.write(table_for(url, loaded))
        full = access(args.keys, [ADAPTER, SERVED_BASE], metered=True)
        with running_haproxy(bare, log=work / "bare.log", access=full):
            reloaded = routed_after(bare, url, loaded, args.adapters, "reload", args.keys)
        # The doors' own cost, where the replica answers at once.
        with running_fleet(1) as fleet:
            replica = fleet.replicas[0]
            replica.adapters[ADAPTER] = "/standin"
            replica.make_resident(ADAPTER)
            stack, quick, _ = three_arms(work, fleet.urls[0], {ADAPTER: "/standin"}, args.keys,
                                         "quick")  # fmt: skip
            with stack:
                standin = latencies(quick, ADAPTER, args.requests)
    finally:
        requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=60)
        if server is not None:
            server.stop()
        if sink is not None:
            sink.shutdown()
    if sink is not None:
        # Exported in every arm alike (module docstring); none at all would mean
        # the replica ran without the product's metering.
        assert SpanSink.batches > 0, "the replica exported no spans"
        out.note(f"the replica exported its spans to a sink in every arm: "
                 f"{SpanSink.batches} OTLP batches")  # fmt: skip
    report(args, out, real, standin, rates, routed, reloaded)


def report(args, out, real, standin, rates, routed, reloaded) -> None:
    lat = out.table(
        "latency",
        ["replica", "path", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
         "added to the door alone, p50 ms"],
        f"one-token completions, one at a time, {args.requests} each path, in turn; "
        f"keys and grants on ({args.keys} keys); added: to direct",
    )  # fmt: skip
    for label, m in (("real vLLM 0.32", real), ("stand-in (answers at once)", standin)):
        p50, p99 = m["p50"], m["p99"]
        for name, path in PATHS.items():
            added = (p50[name] - p50["direct"], p99[name] - p99["direct"])
            over_door = p50[name] - p50["door"] if name == "metered" else None
            lat.row(label, path, p50[name], p99[name], *added, over_door)
    mean = {name: statistics.mean(runs) for name, runs in rates.items()}
    ratio = {name: mean[name] / mean["direct"] if mean["direct"] else 0.0 for name in mean}
    thr = out.table(
        "throughput",
        ["path", "req/s (A-B-C-A-B-C runs)", "mean req/s", "ratio to direct"],
        f"{args.clients} clients back to back for {args.seconds} s, real vLLM",
    )
    for name, path in PATHS.items():
        thr.row(path, " / ".join(f"{r:.1f}" for r in rates[name]), mean[name], ratio[name])
    p50, p99 = percentile(routed, 0.5), percentile(routed, 0.99)
    b50, b99 = percentile(reloaded, 0.5), percentile(reloaded, 0.99)
    rt = out.table(
        "routed",
        ["door", "adapters", "p50 ms", "p99 ms", "max ms"],
        "from the rollout's last step (the door's sync) to the first routed request",
    )
    rt.row("a free slot (the product)", len(routed), p50 * 1000, p99 * 1000, max(routed) * 1000)
    rt.row("a reload (no free slot)", len(reloaded), b50 * 1000, b99 * 1000,
           max(reloaded) * 1000)  # fmt: skip

    def added(m, name, base):
        return m["p50"][name] - m["p50"][base]

    door_adds = {"real": added(real, "door", "direct"), "standin": added(standin, "door", "direct")}
    meter_adds = {"real": added(real, "metered", "door"),
                  "standin": added(standin, "metered", "door")}  # fmt: skip
    kinds = (("the door adds", door_adds, "direct"),
             ("metering and quotas add", meter_adds, "the door alone"))  # fmt: skip
    for what, adds, base in kinds:
        for where, label in (("standin", "stand-in replica"), ("real", "real vLLM")):
            out.verdict(f"latency {what} at p50 to {base} ({label})", adds[where],
                        target="<= 1 ms", met=adds[where] <= 1.0, unit="ms")  # fmt: skip
    for name in ("door", "metered"):
        out.verdict(f"throughput, {PATHS[name]}, vs direct", ratio[name], target=">= 0.95",
                    met=ratio[name] >= 0.95)  # fmt: skip
    out.verdict("rollout end to first routed request, p99", p99 * 1000, target="< 1000",
                met=p99 < 1.0, unit="ms")  # fmt: skip
    out.note(
        "metered tokens against vLLM's own totals (target: equal): bench/metering.py, "
        "its figures under Metering"
    )
    door_met = max(door_adds.values()) <= 1.0
    meter_met = max(meter_adds.values()) <= 1.0
    out.headline(
        "front door with keys and grants: latency added per request, throughput",
        f"{door_adds['real']:+.2f} ms p50 ({door_adds['standin']:+.2f} ms on a stand-in), "
        f"{real['p99']['door'] - real['p99']['direct']:+.2f} ms p99; {ratio['door']:.3f}× direct",
        f"direct to the replica: {real['p50']['direct']:.1f} ms p50, {mean['direct']:.1f} req/s",
        f"≤ 1 ms: {'met' if door_met else 'MISSED'}; "
        f"≥ 0.95×: {'met' if ratio['door'] >= 0.95 else 'MISSED'}",
    )
    out.headline(
        "front door with metering and quotas on: latency added to the door alone, throughput",
        f"{meter_adds['real']:+.2f} ms p50 ({meter_adds['standin']:+.2f} ms on a stand-in); "
        f"{ratio['metered']:.3f}× direct",
        f"the door alone: {door_adds['real']:+.2f} ms p50 over direct, {ratio['door']:.3f}× direct",
        f"≤ 1 ms over the door: {'met' if meter_met else 'MISSED'}; "
        f"≥ 0.95× direct: {'met' if ratio['metered'] >= 0.95 else 'MISSED'}",
    )
    out.headline(
        "rollout end → first request routed by the front door",
        f"{p99 * 1000:.0f} ms p99 ({p50 * 1000:.0f} ms p50), no reload",
        f"by reload: {b99 * 1000:.0f} ms p99 ({b50 * 1000:.0f} ms p50)",
        f"p99 < 1 s: {'met' if p99 < 1.0 else 'MISSED'}",
    )
    for label, m in (("real vLLM", real), ("stand-in", standin)):
        print(
            f"latency p50, {label}: direct {m['p50']['direct']:.2f} ms, door "
            f"{m['p50']['door']:.2f} ms, metered {m['p50']['metered']:.2f} ms: door "
            f"+{added(m, 'door', 'direct'):.2f}, metering +{added(m, 'metered', 'door'):.2f}"
        )
    print(
        f"throughput: direct {mean['direct']:.1f} req/s, door {mean['door']:.1f} "
        f"({ratio['door']:.3f}x), metered {mean['metered']:.1f} ({ratio['metered']:.3f}x)"
    )
    print(f"rollout end -> routed: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
          f"(by reload: p50 {b50 * 1000:.0f} ms, p99 {b99 * 1000:.0f} ms)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="per path, for latency")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    parser.add_argument("--adapters", type=int, default=20, help="new adapters to route")
    parser.add_argument("--keys", type=int, default=1000, help="inference keys at the door")
    parser.add_argument("--replica-urls", default="", help="a running vLLM (else one is started)")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        # Three paths where there were two: as many requests, and as long, as before.
        args.requests, args.clients, args.seconds, args.adapters, args.keys = 20, 2, 0.6, 3, 50
    out = bench_results.Results("door_overhead", args)
    run(args, out)
    out.write()


if __name__ == "__main__":
    main()
