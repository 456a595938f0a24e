"""What the front door costs a request, and how soon it routes a new adapter.

    .venv/bin/python -m bench.door_overhead [--requests 1000] [--clients 8]
        [--seconds 10] [--adapters 20] [--replica-urls URL] [--smoke] [--json PATH]

A real HAProxy (serving/gateway/haproxy.py, keys and grants on: a table of
--keys inference keys, every request carrying one) in front of one real vLLM
0.32 server (CPU, tiny model; --replica-urls to use a running one). In one run:

  latency     one-token completions of an adapter, one at a time, alternately
              through the door and straight to the replica (the baseline, same
              run): p50 and p99 of each, and what the door adds (target: at
              most 1 ms at p50). The same against a stand-in replica (answers in
              well under a millisecond), where the door's own cost is not lost in
              vLLM's noise;
  throughput  --clients clients as fast as they can for --seconds, through the
              door and direct, alternately twice (A-B-A-B: the machine's load
              drifts), the door's ratio to direct (target >= 0.95);
  routed      --adapters new adapters, each loaded on the replica, then the
              rollout's last step (the door's sync with it in the table) and
              requests until the first 200: the seconds from the sync's start
              (p50, p99; target p99 < 1 s), on the door as the product runs it
              (a free slot, no reload) and, as the baseline, on a door without
              free slots (a reload per adapter, as before).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench import results as bench_results
from serving.gateway.access import CallerKey, DoorAccess
from serving.gateway.haproxy import HAProxyFrontDoor
from serving.gateway.routing import ReplicaView, ServedView, routing_table
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


def access(keys: int, models: list[str]) -> DoorAccess:
    """--keys keys of five departments; the bench's own key is legal's."""
    until = int(time.time()) + 86400
    table = {
        hashlib.sha256(f"sk-other-{i}".encode()).hexdigest(): CallerKey(
            key_id=i + 2, department=f"dept-{i % 5}", expires_at=until
        )
        for i in range(keys)
    }
    table[hashlib.sha256(KEY.encode()).hexdigest()] = CallerKey(1, "legal", until)
    allowed = {("legal", m) for m in models} | {(f"dept-{i}", SERVED_BASE) for i in range(5)}
    return DoorAccess(deployment="bench", keys=table, allowed=frozenset(allowed))


def table_for(url: str, loaded: dict[str, str]):
    return routing_table(
        deployment="bench",
        base_model=SERVED_BASE,
        replicas=[ReplicaView(1, url, down=False, loaded=loaded)],
        served=[ServedView(name, path, held=False) for name, path in loaded.items()],
    )


def completion(session: requests.Session, url: str, model: str, key: str = "") -> int:
    body = {"model": model, "prompt": "The contract says", "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return session.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60).status_code


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latencies(door_url: str, direct_url: str, model: str, count: int) -> dict:
    """Alternately through the door and direct, one at a time (keep-alive both)."""
    door, direct = requests.Session(), requests.Session()
    for _ in range(5):  # warm both paths
        completion(door, door_url, model, KEY)
        completion(direct, direct_url, model)
    through, straight = [], []
    for _ in range(count):
        started = time.perf_counter()
        assert completion(door, door_url, model, KEY) == 200
        through.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        assert completion(direct, direct_url, model) == 200
        straight.append((time.perf_counter() - started) * 1000)
    return {
        "door_p50": percentile(through, 0.5),
        "door_p99": percentile(through, 0.99),
        "direct_p50": percentile(straight, 0.5),
        "direct_p99": percentile(straight, 0.99),
        "added_p50": percentile(through, 0.5) - percentile(straight, 0.5),
        "added_p99": percentile(through, 0.99) - percentile(straight, 0.99),
    }


def saturate(url: str, model: str, clients: int, seconds: float, key: str = "") -> float:
    """Requests per second of `clients` clients sending back to back."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        session = requests.Session()
        while time.monotonic() < stop:
            if completion(session, url, model, key) == 200:
                done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


def routed_after(door: HAProxyFrontDoor, server_url: str, loaded: dict, count: int, tag: str,
                 keys: int):  # fmt: skip
    """Seconds from the door's sync (with `count` new adapters, one at a time)
    to the first 200 through it, each adapter loaded on the replica first. The
    sync is what the rollout's last step does (gateway_sync): the routes, then
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
        door.apply_access(access(keys, [SERVED_BASE, *loaded]))
        while completion(session, url, name, KEY) != 200:
            assert time.monotonic() - started < 120, f"{name} not routed"
        seconds.append(time.monotonic() - started)
        session.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
        del loaded[name]
    return seconds


def run(args, out: bench_results.Results) -> None:
    work = Path(tempfile.mkdtemp(prefix="door-overhead-"))
    server = None
    if args.replica_urls:
        url = args.replica_urls.split(",")[0]
    else:
        ensure_vllm_installed()
        server = VLLMServer(
            name="door-bench", model_dir=ensure_tiny_model(), max_loras=2, max_cpu_loras=8,
            max_lora_rank=16, log_dir=work / "vllm",
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
        door = HAProxyFrontDoor(work / "door", listen=f"127.0.0.1:{free_port()}")
        door.write(table_for(url, loaded))
        table = access(args.keys, [ADAPTER, SERVED_BASE])
        with running_haproxy(door, log=work / "haproxy.log", access=table):
            door_url = f"http://{door.listen}"
            real = latencies(door_url, url, ADAPTER, args.requests)
            rates = {"door": [], "direct": []}
            for _ in range(2):
                rates["direct"].append(saturate(url, ADAPTER, args.clients, args.seconds))
                rates["door"].append(saturate(door_url, ADAPTER, args.clients, args.seconds, KEY))
            routed = routed_after(door, url, loaded, args.adapters, "new", args.keys)
        # The baseline of the routing: a door without free slots reloads per adapter.
        bare = HAProxyFrontDoor(work / "bare", listen=f"127.0.0.1:{free_port()}", slots=0)
        bare.write(table_for(url, loaded))
        with running_haproxy(bare, log=work / "bare.log", access=table):
            reloaded = routed_after(bare, url, loaded, args.adapters, "reload", args.keys)
        # The door's own cost, where the replica answers at once.
        with running_fleet(1) as fleet:
            replica = fleet.replicas[0]
            replica.adapters[ADAPTER] = "/standin"
            replica.make_resident(ADAPTER)
            quick = HAProxyFrontDoor(work / "quick", listen=f"127.0.0.1:{free_port()}")
            quick.write(table_for(fleet.urls[0], {ADAPTER: "/standin"}))
            with running_haproxy(quick, log=work / "quick.log", access=table):
                standin = latencies(f"http://{quick.listen}", fleet.urls[0], ADAPTER, args.requests)
    finally:
        requests.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=60)
        if server is not None:
            server.stop()
    report(args, out, real, standin, rates, routed, reloaded)


def report(args, out, real, standin, rates, routed, reloaded) -> None:
    lat = out.table(
        "latency",
        ["replica", "door p50 ms", "direct p50 ms", "added p50 ms", "door p99 ms",
         "direct p99 ms", "added p99 ms"],
        f"one-token completions, one at a time, {args.requests} each way, alternating; "
        f"keys and grants on ({args.keys} keys)",
    )  # fmt: skip
    for label, m in (("real vLLM 0.32", real), ("stand-in (answers at once)", standin)):
        lat.row(label, m["door_p50"], m["direct_p50"], m["added_p50"], m["door_p99"],
                m["direct_p99"], m["added_p99"])  # fmt: skip
    door_rps, direct_rps = statistics.mean(rates["door"]), statistics.mean(rates["direct"])
    ratio = door_rps / direct_rps if direct_rps else 0.0
    thr = out.table(
        "throughput",
        ["path", "req/s (A-B-A-B runs)", "mean req/s", "ratio"],
        f"{args.clients} clients back to back for {args.seconds} s, real vLLM",
    )
    thr.row("direct", " / ".join(f"{r:.1f}" for r in rates["direct"]), direct_rps, 1.0)
    thr.row("through the door", " / ".join(f"{r:.1f}" for r in rates["door"]), door_rps, ratio)
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
    added = standin["added_p50"]
    out.verdict("latency the door adds at p50 (stand-in replica)", added, target="<= 1 ms",
                met=added <= 1.0, unit="ms")  # fmt: skip
    out.verdict("latency the door adds at p50 (real vLLM)", real["added_p50"], target="<= 1 ms",
                met=real["added_p50"] <= 1.0, unit="ms")  # fmt: skip
    out.verdict("throughput through the door vs direct", ratio, target=">= 0.95",
                met=ratio >= 0.95)  # fmt: skip
    out.verdict("rollout end to first routed request, p99", p99 * 1000, target="< 1000",
                met=p99 < 1.0, unit="ms")  # fmt: skip
    out.headline(
        "front door with keys and grants: latency added per request, throughput",
        f"{real['added_p50']:+.2f} ms p50 ({added:+.2f} ms on a stand-in), "
        f"{real['added_p99']:+.2f} ms p99; {ratio:.3f}× direct",
        f"direct to the replica: {real['direct_p50']:.1f} ms p50, {direct_rps:.1f} req/s",
        f"≤ 1 ms: {'met' if real['added_p50'] <= 1.0 and added <= 1.0 else 'MISSED'}; "
        f"≥ 0.95×: {'met' if ratio >= 0.95 else 'MISSED'}",
    )
    out.headline(
        "rollout end → first request routed by the front door",
        f"{p99 * 1000:.0f} ms p99 ({p50 * 1000:.0f} ms p50), no reload",
        f"by reload: {b99 * 1000:.0f} ms p99 ({b50 * 1000:.0f} ms p50)",
        f"p99 < 1 s: {'met' if p99 < 1.0 else 'MISSED'}",
    )
    for label, m in (("real vLLM", real), ("stand-in", standin)):
        print(
            f"latency, {label}: door {m['door_p50']:.2f} ms p50, direct {m['direct_p50']:.2f}"
            f" ms: +{m['added_p50']:.2f} ms (p99 +{m['added_p99']:.2f})"
        )
    print(f"throughput: door {door_rps:.1f} req/s, direct {direct_rps:.1f}: {ratio:.3f}x")
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
        args.requests, args.clients, args.seconds, args.adapters, args.keys = 30, 2, 1.0, 3, 50
    out = bench_results.Results("door_overhead", args)
    run(args, out)
    out.write()


if __name__ == "__main__":
    main()
