"""One department past its limit against another's latency at the front door.

    .venv/bin/python -m bench.door_limits [--requests 200] [--rounds 3]
        [--clients 4] [--rate 1000] [--smoke] [--json PATH]

Two real HAProxy doors (serving/door/haproxy/) with keys and limits on, in
front of one stand-in replica (tests/support/vllm_standin.py: answers in well
under a millisecond, so a door's own time is not lost in vLLM's). Two
departments: `batch`, limited to 60 requests a minute, and `finance`, with a
limit too high to reach, which always calls the first door. In each of
--rounds rounds, in turn, --requests one-token completions of finance's, one
at a time:

  quiet      nothing else running;
  elsewhere  while --clients connections of batch, in a process of their own,
             send --rate requests a second in all to the OTHER door (past its
             60 a minute at once: nearly every answer a 429): the baseline,
             the same load on the same two cores, not sharing finance's door;
  here       the same load on finance's door.

Printed: finance's p50 and p99 in each, what sharing the door with the
refused load costs (here against elsewhere at p50; target: at most 1.5x, which
a door that queued or counted the others behind the refused would miss by
far), finance's errors (target: none), and batch's answers (429s and the 200s
its minute let through). Rounds alternate, so the machine's drift falls on
every phase.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from bench import results as bench_results
from bench.door_overhead import percentile
from serving.door.callers import CallerKey, DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, routing_table
from tests.support.haproxy import running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

BASE = "tiny-llama"
FINANCE_KEY = "sk-bench-finance-0123456789"
BATCH_KEY = "sk-bench-batch-0123456789"
BATCH_RPM = 60
HIGH_RPM = 1_000_000_000
TARGET_RATIO = 1.5

# batch's clients: as fast as the door answers, until stdin closes; then the
# count of each status on stdout.
LOAD = """
import http.client, sys, threading, time
host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
clients, rate = int(sys.argv[4]), float(sys.argv[5])
body = b'{"model": "tiny-llama", "prompt": "load", "max_tokens": 1}'
counts, stop = {}, threading.Event()
def run():
    connection = http.client.HTTPConnection(host, port, timeout=30)
    interval, due = clients / rate, time.monotonic()
    while not stop.is_set():
        connection.request("POST", "/v1/completions", body, {
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        counts[response.status] = counts.get(response.status, 0) + 1
        due += interval
        stop.wait(max(0.0, due - time.monotonic()))
threads = [threading.Thread(target=run) for _ in range(clients)]
[t.start() for t in threads]
print("started", flush=True)
sys.stdin.read()
stop.set()
[t.join() for t in threads]
print(" ".join(f"{k}:{v}" for k, v in sorted(counts.items())), flush=True)
"""


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def access_table() -> DoorAccess:
    hour = int(time.time()) + 3600
    return DoorAccess(
        deployment="bench",
        keys={
            _sha(FINANCE_KEY): CallerKey(key_id=1, department="finance", expires_at=hour),
            _sha(BATCH_KEY): CallerKey(key_id=2, department="batch", expires_at=hour),
        },
        allowed=frozenset({("finance", BASE), ("batch", BASE)}),
        rpm={"dept:batch": BATCH_RPM, "dept:finance": HIGH_RPM},
    )


def keyed_latencies(url: str, key: str, count: int) -> tuple[list[float], int]:
    """Milliseconds of `count` completions with `key`, one at a time, and how
    many were not 200."""
    session = requests.Session()
    session.trust_env = False
    times, errors = [], 0
    for _ in range(count):
        started = time.perf_counter()
        answer = session.post(
            f"{url}/v1/completions",
            json={"model": BASE, "prompt": "The ledger says", "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        times.append((time.perf_counter() - started) * 1000)
        errors += answer.status_code != 200
    return times, errors


def with_batch_refused(listen: str, clients: int, rate: float, measure):
    """Runs `measure()` while batch's clients hammer the door; its result,
    batch's status counts and the seconds batch ran."""
    host, port = listen.rsplit(":", 1)
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, host, port, BATCH_KEY, str(clients), str(rate)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert load.stdout.readline().strip() == "started"
        started = time.monotonic()
        time.sleep(0.5)  # past its 60 a minute by now
        measured = measure()
        out, _ = load.communicate("", timeout=60)
        seconds = time.monotonic() - started
    finally:
        if load.poll() is None:
            load.kill()
    counts = {int(k): int(v) for k, v in (pair.split(":") for pair in out.split())}
    return measured, counts, seconds


PHASES = {
    "quiet": "quiet",
    "elsewhere": "beside batch refused by another door",
    "here": "beside batch refused by the same door",
}


def run(args, out: bench_results.Results) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-door-limits-") as folder,
        running_fleet(1) as fleet,
        contextlib.ExitStack() as stack,
    ):
        table = routing_table(
            deployment="bench",
            base_model=BASE,
            replicas=[ReplicaView(1, fleet.urls[0], False, {})],
            served=[],
        )
        doors = {}
        for name in ("finance", "other"):
            door = HAProxyFrontDoor(Path(folder) / name, listen=f"127.0.0.1:{free_port()}")
            door.write(table)
            log = Path(folder) / f"{name}.log"
            stack.enter_context(running_haproxy(door, log=log, access=access_table()))
            doors[name] = door
        url = f"http://{doors['finance'].listen}"
        keyed_latencies(url, FINANCE_KEY, 20)  # warm
        times: dict[str, list[float]] = {phase: [] for phase in PHASES}
        errors = dict.fromkeys(PHASES, 0)
        batch: dict[int, int] = {}
        batch_seconds = 0.0
        for round_number in range(args.rounds):
            measured, failed = keyed_latencies(url, FINANCE_KEY, args.requests)
            times["quiet"] += measured
            errors["quiet"] += failed
            for phase, door in (("elsewhere", doors["other"]), ("here", doors["finance"])):
                (measured, failed), counts, seconds = with_batch_refused(
                    door.listen,
                    args.clients,
                    args.rate,
                    lambda: keyed_latencies(url, FINANCE_KEY, args.requests),
                )
                times[phase] += measured
                errors[phase] += failed
                batch_seconds += seconds
                for status, count in counts.items():
                    batch[status] = batch.get(status, 0) + count
            print(
                f"round {round_number + 1}: finance p50 "
                + ", ".join(
                    f"{statistics.median(times[phase][-args.requests :]):.2f} ms {PHASES[phase]}"
                    for phase in PHASES
                ),
                flush=True,
            )
    p50 = {phase: statistics.median(values) for phase, values in times.items()}
    latency = out.table(
        "latency",
        ["finance's requests", "count", "p50 ms", "p99 ms", "errors"],
        f"Another department's latency while batch ({args.rate:.0f} requests a second) is refused",
    )
    for phase, label in PHASES.items():
        latency.row(
            label, len(times[phase]), p50[phase], percentile(times[phase], 0.99), errors[phase]
        )
    answers = out.table("batch", ["status", "answers"], "batch's answers from the doors")
    for status, count in sorted(batch.items()):
        answers.row(status, count)
    ratio = p50["here"] / p50["elsewhere"]
    out.verdict(
        "finance p50, batch refused by the same door / by another door",
        ratio,
        target=f"<= {TARGET_RATIO}x",
        met=ratio <= TARGET_RATIO,
    )
    out.verdict(
        "finance errors beside batch refused",
        sum(errors.values()),
        target="0",
        met=not any(errors.values()),
        unit="",
    )
    out.note(
        "The door answers batch's 429s itself (HAProxy stick tables, no backend). The same "
        "load refused by another door is the baseline: it takes the same CPU from the two "
        "cores, so the difference is what sharing the door costs."
    )
    print(
        "finance p50 "
        + ", ".join(f"{p50[phase]:.2f} ms {label}" for phase, label in PHASES.items())
        + f" ({ratio:.2f}x, target <= {TARGET_RATIO}x); errors {errors}; batch {batch} "
        f"(about {batch.get(429, 0) / batch_seconds:.0f} refusals a second)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="finance's, per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4, help="batch's connections")
    parser.add_argument(
        "--rate", type=float, default=1000, help="batch's requests a second, all clients"
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.rounds = 30, 1
    out = bench_results.Results("door_limits", args)
    run(args, out)
    out.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
