"""What TLS at the front door adds to a request, against the same door in clear.

    .venv/bin/python -m bench.door_tls [--requests 300] [--rounds 3] [--smoke] [--json PATH]

Two real HAProxy doors (serving/door/haproxy/) with keys on, the same
configuration but for the bind: one plain HTTP, one terminating TLS with a
certificate from a CA this bench makes (ECDSA P-256, as cert-manager issues
by default in many setups; TLS 1.3 is what Python and HAProxy 2.6 agree on),
in front of one stand-in replica (tests/support/vllm_standin.py: it answers
in well under a millisecond, so the door's own time is not lost in vLLM's).
One-token completions, one at a time (http.client, HTTP/1.1), one request
of each path in turn (a shared machine's load moves in seconds, so every
path meets the same), in rounds that change the order:

  direct          straight to the replica: the baseline;
  plain           through the plain door, one kept-alive connection;
  tls             through the TLS door, one kept-alive connection;
  plain, new      through the plain door, a new connection each request;
  tls, new        through the TLS door, a new connection (a full handshake)
                  each request.

Printed: p50 and p99 of each, what each door adds to direct at p50, and
what TLS adds to the plain door on a kept-alive connection (target: at most
1 ms at p50, bench.door_overhead's bound for the whole door) and with a
handshake each request (reported, no target: clients keep connections open;
the `openai` client does).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import results as bench_results
from bench.door_overhead import percentile
from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, routing_table
from tests.support.haproxy import running_haproxy
from tests.support.tls import make_authority
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

BASE = "tiny-llama"
KEY = "sk-bench-tls-0123456789"
BODY = b'{"model": "tiny-llama", "prompt": "The contract says", "max_tokens": 1}'
TARGET_MS = 1.0
PATHS = {
    "direct": "direct to the replica",
    "plain": "plain door, kept-alive",
    "tls": "TLS door, kept-alive",
    "plain_new": "plain door, new connection each",
    "tls_new": "TLS door, new connection each",
}


def access_table() -> DoorAccess:
    return DoorAccess(
        deployment="bench",
        keys={
            hashlib.sha256(KEY.encode()).hexdigest(): CallerKey(
                key_id=1, department="legal", expires_at=int(time.time()) + 86400
            )
        },
        allowed=frozenset({("legal", BASE)}),
    )


class Caller:
    """One way to the replica: a connection factory, kept or new each time."""

    def __init__(self, address: str, context: ssl.SSLContext | None, *, keep: bool):
        host, port = address.rsplit(":", 1)
        self.host, self.port, self.context, self.keep = host, int(port), context, keep
        self.connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=30)
        return http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.context)

    def call(self) -> int:
        if self.connection is None or not self.keep:
            self.connection = self._connect()
        self.connection.request(
            "POST",
            "/v1/completions",
            BODY,
            {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        response = self.connection.getresponse()
        response.read()
        if not self.keep:
            self.connection.close()
        return response.status

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def timed(path: Caller, count: int) -> tuple[list[float], int]:
    times, errors = [], 0
    for _ in range(count):
        started = time.perf_counter()
        status = path.call()
        times.append((time.perf_counter() - started) * 1000)
        errors += status != 200
    return times, errors


def run(args, out: bench_results.Results) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-door-tls-") as folder,
        running_fleet(1) as fleet,
        contextlib.ExitStack() as stack,
    ):
        authority = make_authority(Path(folder) / "ca")
        table = routing_table(
            deployment="bench",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        doors = {}
        for name, certificate in (("plain", ""), ("tls", str(authority.pem))):
            door = HAProxyFrontDoor(
                Path(folder) / name, listen=f"127.0.0.1:{free_port()}", certificate=certificate
            )
            door.write(table)
            log = Path(folder) / f"{name}.log"
            stack.enter_context(running_haproxy(door, log=log, access=access_table()))
            doors[name] = door
        context = ssl.create_default_context(cafile=str(authority.ca))
        # http.client offers no ALPN: HTTP/1.1 on both doors, the same protocol.
        replica = fleet.urls[0].removeprefix("http://").rstrip("/")
        paths = {
            "direct": Caller(replica, None, keep=True),
            "plain": Caller(doors["plain"].listen, None, keep=True),
            "tls": Caller(doors["tls"].listen, context, keep=True),
            "plain_new": Caller(doors["plain"].listen, None, keep=False),
            "tls_new": Caller(doors["tls"].listen, context, keep=False),
        }
        with sock_version(doors["tls"].listen, context) as version:
            out.note(f"TLS door: {version}, ECDSA P-256 certificate, HAProxy's default ciphers.")
        for path in paths.values():
            timed(path, 20)  # warm
        times: dict[str, list[float]] = {name: [] for name in PATHS}
        errors = dict.fromkeys(PATHS, 0)
        for round_number in range(args.rounds):
            # One request of each path in turn, each round in another order: the
            # load of a shared machine moves in seconds, so every path meets it.
            shift = round_number % len(PATHS)
            order = list(PATHS)[shift:] + list(PATHS)[:shift]
            for _ in range(args.requests):
                for name in order:
                    measured, failed = timed(paths[name], 1)
                    times[name] += measured
                    errors[name] += failed
            print(
                f"round {round_number + 1}: p50 "
                + ", ".join(
                    f"{name} {statistics.median(times[name][-args.requests :]):.2f} ms"
                    for name in PATHS
                ),
                flush=True,
            )
        for path in paths.values():
            path.close()
    report(out, times, errors)


@contextlib.contextmanager
def sock_version(address: str, context: ssl.SSLContext):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
    try:
        connection.connect()
        yield connection.sock.version()
    finally:
        connection.close()


def report(out: bench_results.Results, times: dict, errors: dict) -> None:
    p50 = {name: statistics.median(values) for name, values in times.items()}
    latency = out.table(
        "latency",
        ["path", "count", "p50 ms", "p99 ms", "added to direct, p50 ms", "errors"],
        "One-token completions one at a time, stand-in replica",
    )
    for name, label in PATHS.items():
        latency.row(
            label,
            len(times[name]),
            p50[name],
            percentile(times[name], 0.99),
            p50[name] - p50["direct"],
            errors[name],
        )
    kept = p50["tls"] - p50["plain"]
    handshake = p50["tls_new"] - p50["plain_new"]
    out.verdict(
        "TLS added to the door, kept-alive connection, p50",
        kept,
        target=f"<= {TARGET_MS} ms",
        met=kept <= TARGET_MS,
        unit="ms",
    )
    out.verdict(
        "TLS added to the door, a handshake each request, p50",
        handshake,
        target="reported",
        met=True,
        unit="ms",
    )
    out.verdict("errors", sum(errors.values()), target="0", met=not any(errors.values()), unit="")
    print(
        "p50 "
        + ", ".join(f"{PATHS[name]} {p50[name]:.2f} ms" for name in PATHS)
        + f"; TLS adds {kept:.2f} ms kept-alive (target <= {TARGET_MS} ms), "
        f"{handshake:.2f} ms with a handshake each request; errors {errors}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per path and round")
    parser.add_argument("--rounds", type=int, default=3)
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.rounds = 30, 1
    out = bench_results.Results("door_tls", args)
    run(args, out)
    out.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
