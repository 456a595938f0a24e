"""What strangers' slow bodies cost the front door's memory, and a keyed
caller's latency meanwhile.

    .venv/bin/python -m bench.door_memory [--strangers 1000] [--before 300]
        [--requests 200] [--smoke] [--json PATH]

A real HAProxy door (serving/door/haproxy/, as the product renders it) in
front of one stand-in replica (tests/support/vllm_standin.py: answers in well
under a millisecond). HAProxy's worker's resident memory (VmRSS) is sampled
every 20 ms. In one run, in turn:

  quiet       --requests one-token completions with a key, one at a time: the
              latency baseline, and the memory before anything else;
  strangers   --strangers connections without a key, from 8 loopback addresses
              (so that the per-address cap is not what bounds them), each
              sending its headers and 949 KB of a 950 KB body and then holding
              the connection: the peak memory, the keyed latency meanwhile,
              the connections the door still held, and the memory 3 s after
              they closed;
  slowloris   --strangers connections that send half their headers and hold:
              the same figures;
  one key     100 connections with one key, each sending 949 KB of its body
              and holding: at most SERVING_DOOR_KEY_CONCURRENCY of them are
              taken, the rest get a 429 before their body is read; then the
              memory after HAProxy's own malloc_trim (SIGQUIT: its pool
              collection, which the product does not send);
  before      the baseline: --before strangers as above against a door
              rendered as it was before issue 43 (`option http-buffer-request`,
              the body buffered before the key is checked; glibc's trim
              threshold at 256 MiB; `timeout http-request 30s`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import results as bench_results
from bench.door_limits import keyed_latencies
from bench.door_overhead import percentile
from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.haproxy.config import KEY_CONCURRENCY
from serving.door.haproxy.front_door import GLIBC_TUNABLES
from serving.door.routing import ReplicaView, routing_table
from tests.support.haproxy import running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

BASE = "tiny-llama"
KEY = "sk-bench-memory-0123456789"
SLOW_KEY = "sk-bench-slow-0123456789"
BODY = 950_000
SENT = BODY - 1_000
SOURCES = [f"127.0.0.{n}" for n in range(2, 10)]
OLD_TUNABLES = (
    "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"
)
MIB = 1024 * 1024


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table() -> DoorAccess:
    hour = int(time.time()) + 3600
    return DoorAccess(
        deployment="bench",
        keys={
            _sha(KEY): CallerKey(key_id=1, department="legal", expires_at=hour),
            _sha(SLOW_KEY): CallerKey(key_id=2, department="legal", expires_at=hour),
        },
        allowed=frozenset({("legal", BASE)}),
    )


class Door(HAProxyFrontDoor):
    """The door; `before`: rendered as it was before issue 43."""

    def __init__(self, *args, before: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.before = before

    def command_line(self) -> list[str]:
        line = super().command_line()
        if self.before:
            line[line.index(GLIBC_TUNABLES)] = OLD_TUNABLES
        return line

    def write(self, table, states=None) -> bool:
        changed = super().write(table, states)
        if self.before:
            config = self.config_path.read_text()
            config = config.replace(
                f"    bind {self.listen}\n",
                f"    bind {self.listen}\n    option http-buffer-request\n",
            )
            config = config.replace("timeout http-request 5s", "timeout http-request 30s")
            self.config_path.write_text(config)
        return changed


class Memory:
    """The worker's VmRSS, sampled every 20 ms: now, and the peak since reset()."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def now(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def reset(self) -> None:
        self.peak = self.now()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.now())


class Crowd:
    """`count` connections, each sending `head` then `body` and holding until
    release(); how many the door still holds, and the statuses it answered."""

    def __init__(self, listen: str, count: int, head: bytes, body: bytes, sources=SOURCES):
        host, port = listen.rsplit(":", 1)
        self.address = (host, int(port))
        self.hold = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.closed = 0
        self.statuses: dict[int, int] = {}
        self.done = threading.Semaphore(0)
        self.threads = [
            threading.Thread(
                target=self._one, args=(sources[n % len(sources)], head, body), daemon=True
            )
            for n in range(count)
        ]
        for thread in self.threads:
            thread.start()
        for _ in self.threads:
            self.done.acquire()

    def _one(self, source: str, head: bytes, body: bytes) -> None:
        sock = None
        try:
            sock = socket.create_connection(self.address, timeout=30, source_address=(source, 0))
            sock.sendall(head)
            for start in range(0, len(body), 65536):
                sock.sendall(body[start : start + 65536])
            with self.lock:
                self.sent += 1
        except OSError:
            pass
        finally:
            self.done.release()
        answer = b""
        if sock is not None:
            sock.settimeout(0.5)
            with contextlib.suppress(OSError):
                answer = sock.recv(256)
        with self.lock:
            if answer[:5] == b"HTTP/":
                status = int(answer.split(b" ", 2)[1])
                self.statuses[status] = self.statuses.get(status, 0) + 1
        self.hold.wait()
        if sock is not None:
            sock.close()

    def still_open(self) -> int:
        """Connections the door has not closed (a peek that finds no EOF)."""
        return sum(thread.is_alive() for thread in self.threads)

    def release(self) -> None:
        self.hold.set()
        for thread in self.threads:
            thread.join(10)


def body_head(key: str = "") -> bytes:
    authorization = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: door\r\n{authorization}"
        f"Content-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
    ).encode()


def slow_body() -> bytes:
    return b'{"model":"tiny-llama","prompt":"' + b"x" * (SENT - 33)


def door_sessions(door: HAProxyFrontDoor) -> int:
    for line in door.runtime.command("show info").splitlines():
        if line.startswith("CurrConns:"):
            return int(line.split(":")[1])
    return 0


def phase(door, memory: Memory, url: str, crowd_of, requests_each: int) -> dict:
    """Runs a crowd, measures meanwhile, lets it go; the figures."""
    before = memory.now()
    memory.reset()
    started = time.monotonic()
    crowd = crowd_of()
    settled = time.monotonic() - started
    time.sleep(0.5)
    held = door_sessions(door)
    latencies, errors = keyed_latencies(url, KEY, requests_each) if requests_each else ([], 0)
    peak = memory.peak
    crowd.release()
    time.sleep(3)
    return {
        "before": before,
        "peak": peak,
        "after": memory.now(),
        "held": held,
        "sent": crowd.sent,
        "statuses": dict(crowd.statuses),
        "latencies": latencies,
        "errors": errors,
        "seconds": settled,
    }


def running_door(folder: Path, fleet, *, before: bool):
    table = routing_table(
        deployment="bench",
        base_model=BASE,
        replicas=[ReplicaView(1, fleet.urls[0], False, {})],
        served=[],
    )
    name = "before" if before else "door"
    door = Door(folder / name, listen=f"127.0.0.1:{free_port()}", before=before)
    door.write(table)
    return door, running_haproxy(door, log=folder / f"{name}.log", access=access_table())


def run(args, out: bench_results.Results) -> None:
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-door-memory-") as name,
        running_fleet(1) as fleet,
    ):
        folder = Path(name)
        door, running = running_door(folder, fleet, before=False)
        with running:
            url = f"http://{door.listen}"
            memory = Memory(door.runtime.worker_pid())
            keyed_latencies(url, KEY, 20)  # warm
            quiet, quiet_errors = keyed_latencies(url, KEY, args.requests)
            idle = memory.now()
            head = body_head()
            strangers = phase(
                door,
                memory,
                url,
                lambda: Crowd(door.listen, args.strangers, head, slow_body()),
                args.requests,
            )
            half = b"POST /v1/completions HTTP/1.1\r\nHost: door\r\nContent-Type: appl"
            slowloris = phase(
                door,
                memory,
                url,
                lambda: Crowd(door.listen, args.strangers, half, b""),
                args.requests,
            )
            one_key = phase(
                door,
                memory,
                url,
                lambda: Crowd(door.listen, args.keyed, body_head(SLOW_KEY), slow_body()),
                0,
            )
            # HAProxy's pool collection (SIGQUIT: it dumps its pools and calls
            # malloc_trim), which the product does not send: what glibc kept.
            os.kill(memory.pid, signal.SIGQUIT)
            time.sleep(1)
            trimmed = memory.now()
            memory.stop.set()
        rows += [
            ("strangers' slow bodies", args.strangers, strangers),
            ("strangers' unfinished headers", args.strangers, slowloris),
            ("one key's slow bodies", args.keyed, one_key),
        ]
        old, running = running_door(folder, fleet, before=True)
        with running:
            old_memory = Memory(old.runtime.worker_pid())
            keyed_latencies(f"http://{old.listen}", KEY, 20)
            before = phase(
                old,
                old_memory,
                f"http://{old.listen}",
                lambda: Crowd(old.listen, args.before, body_head(), slow_body()),
                0,
            )
            old_memory.stop.set()
        rows.append(("before issue 43: strangers' slow bodies", args.before, before))

    table = out.table(
        "memory",
        [
            "connections",
            "count",
            "held by the door",
            "answers",
            "RSS before MiB",
            "peak MiB",
            "3 s after MiB",
        ],
        "HAProxy's memory (worker VmRSS) with connections holding unfinished requests",
    )
    for label, count, figures in rows:
        answers = ", ".join(f"{n}× {s}" for s, n in sorted(figures["statuses"].items())) or "-"
        table.row(
            label,
            count,
            figures["held"],
            answers,
            figures["before"] / MIB,
            figures["peak"] / MIB,
            figures["after"] / MIB,
        )
    latency = out.table(
        "latency",
        ["keyed requests", "count", "p50 ms", "p99 ms", "errors"],
        "A keyed caller's one-token completions, one at a time",
    )
    latency.row(
        "quiet", len(quiet), statistics.median(quiet), percentile(quiet, 0.99), quiet_errors
    )
    for label, _, figures in rows[:2]:
        if figures["latencies"]:
            latency.row(
                f"beside {label}",
                len(figures["latencies"]),
                statistics.median(figures["latencies"]),
                percentile(figures["latencies"], 0.99),
                figures["errors"],
            )
    grown = (strangers["peak"] - idle) / MIB
    kept = (strangers["after"] - idle) / MIB
    old_grown = (before["peak"] - before["before"]) / MIB
    old_kept = (before["after"] - before["before"]) / MIB
    ratio = statistics.median(strangers["latencies"]) / statistics.median(quiet)
    out.verdict(
        f"growth with {args.strangers} strangers' slow bodies",
        grown,
        target="<= 64",
        met=grown <= 64,
        unit=" MiB",
    )
    out.verdict("kept 3 s after they closed", kept, target="<= 16", met=kept <= 16, unit=" MiB")
    out.verdict(
        "keyed p50 beside them / quiet", ratio, target="<= 1.5x", met=ratio <= 1.5, unit="x"
    )
    taken = one_key["statuses"].get(429, 0)
    out.verdict(
        f"one key's slow bodies refused past its cap of {KEY_CONCURRENCY}",
        taken,
        target=f">= {args.keyed - KEY_CONCURRENCY}",
        met=taken >= args.keyed - KEY_CONCURRENCY,
        unit="",
    )
    out.note(
        f"Before (the same run, a door rendered as before issue 43): {args.before} strangers "
        f"grew HAProxy by {old_grown:.0f} MiB and {old_kept:.0f} MiB were still held 3 s after "
        "they closed. Now a request without a key is answered 401 as soon as its headers are "
        "in, before a byte of its body is buffered; unfinished headers are held at most "
        "`timeout http-request` (5 s); a key holds at most its cap of requests in flight; the "
        "strangers come from 8 loopback addresses so that the per-address cap (256) is not what "
        "bounds them."
    )
    out.note(
        "Unfinished headers from many addresses fill the door's 768 connections for up to "
        "5 s each: a keyed caller's connection opened meanwhile waits for a free one (its p99 "
        "above), one kept alive is served as before."
    )
    out.note(
        f"After one key's slow bodies closed, glibc kept {one_key['after'] / MIB:.0f} MiB "
        f"(below chunks still in use); HAProxy's own malloc_trim (its pool collection, sent "
        f"SIGQUIT here, not by the product) brought it to {trimmed / MIB:.0f} MiB."
    )
    out.data["trimmed_mib"] = trimmed / MIB
    out.headline(
        f"Front door memory, {args.strangers} strangers' slow bodies",
        f"+{grown:.0f} MiB, {kept:.0f} MiB kept after",
        f"+{old_grown:.0f} MiB, {old_kept:.0f} MiB kept, for {args.before} before issue 43",
        "bounded, returned",
    )
    for label, count, figures in rows:
        print(
            f"{label} ({count}): held {figures['held']}, answers {figures['statuses']}, RSS "
            f"{figures['before'] / MIB:.0f} -> peak {figures['peak'] / MIB:.0f} -> "
            f"{figures['after'] / MIB:.0f} MiB"
        )
    print(
        f"keyed p50 quiet {statistics.median(quiet):.2f} ms, beside strangers "
        f"{statistics.median(strangers['latencies']):.2f} ms ({ratio:.2f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strangers", type=int, default=1000)
    parser.add_argument("--before", type=int, default=300, help="strangers at the old door")
    parser.add_argument("--keyed", type=int, default=100, help="one key's slow bodies")
    parser.add_argument("--requests", type=int, default=200, help="keyed, per phase")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.strangers, args.before, args.keyed, args.requests = 60, 20, 40, 20
    out = bench_results.Results("door_memory", args)
    run(args, out)
    out.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
