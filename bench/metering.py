"""Tokens metered through faults, against vLLM's own totals.

    .venv/bin/python -m bench.metering [--requests 10000] [--clients 4]
        [--streamed 0.33] [--smoke] [--json PATH]

The product as it runs: its web process (gunicorn, 2 workers, on SQLite) as
the OTLP receiver, one real vLLM 0.32 (CPU, tiny model) exporting a span per
request to it (scripts/vllm/serve.sh, SERVE_OTLP_TRACES_ENDPOINT), and a real
HAProxy door with keys (two departments, the base model and an adapter
version). --clients clients send --requests one- and two-token chat
completions through the door, --streamed of them streamed, in four quarters:

  1. no fault;
  2. the door reloads (hitless, a new worker) while they run;
  3. the receiver's gunicorn workers are SIGKILLed while batches arrive
     (every 0.2 s: whether a worker was inside its transaction at that moment
     is not controlled; gunicorn starts new ones, the exporter retries);
  4. after the replica restarted (SIGTERM with no request in flight: vLLM
     exports its last spans at exit; its Prometheus totals start again at 0).

Then it waits until the ledger stops growing and compares: tokens metered
(the product's ledger and its day rows) against vLLM's own
`vllm:prompt_tokens_total` and `vllm:generation_tokens_total` (summed over
its two lives), and against the `usage` the clients were told. Target: equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from bench import results as bench_results

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVED_BASE = "tiny-llama"
ADAPTER = "template"
DEPLOYMENT = "metered"
KEYS = {"legal": "sk-bench-meter-legal-0123456789", "finance": "sk-bench-meter-fin-0123456789"}


def vllm_totals(url: str) -> tuple[int, int]:
    text = requests.get(url + "/metrics", timeout=10).text
    totals = {"vllm:prompt_tokens": 0.0, "vllm:generation_tokens": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(totals["vllm:prompt_tokens"]), int(totals["vllm:generation_tokens"])


class Traffic:
    """Clients sending chat completions through the door; what they were told."""

    def __init__(self, url: str, clients: int, streamed: float, seed: int = 0):
        self.url = url
        self.clients = clients
        self.streamed = streamed
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.told = Counter()  # ok, streamed, prompt, completion, failed

    def one(self, session: requests.Session, index: int) -> None:
        department = ("legal", "finance")[index % 2]
        model = (ADAPTER, SERVED_BASE)[(index // 2) % 2]
        stream = (index % 100) < self.streamed * 100
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Clause {index} of the contract says"}],
            "max_tokens": 1 + index % 2,
            "temperature": 0,
            "stream": stream,
        }
        headers = {"Authorization": f"Bearer {KEYS[department]}"}
        try:
            response = session.post(
                self.url + "/v1/chat/completions",
                json=body,
                headers=headers,
                timeout=120,
                stream=stream,
            )
            usage = None
            if response.status_code == 200 and not stream:
                usage = response.json()["usage"]
            elif response.status_code == 200:
                for line in response.iter_lines():
                    if line.startswith(b"data: {"):
                        usage = json.loads(line[6:]).get("usage") or usage
        except requests.RequestException:
            usage = None
        with self.lock:
            if usage is None:
                self.told["failed"] += 1
                return
            self.told["ok"] += 1
            self.told["streamed"] += int(stream)
            self.told["prompt"] += usage["prompt_tokens"]
            self.told["completion"] += usage["completion_tokens"]

    def run(self, start: int, count: int) -> None:
        next_index = iter(range(start, start + count))
        lock = threading.Lock()

        def client():
            session = requests.Session()
            session.trust_env = False
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None:
                    return
                self.one(session, index)

        threads = [threading.Thread(target=client) for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def configure(var_dir: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["VAR_DIR"] = str(var_dir)
    os.environ["DJANGO_DEBUG"] = "true"
    os.environ["DJANGO_SECRET_KEY"] = "bench-only-secret-key"
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver,localhost,127.0.0.1"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.pop("DATABASE_URL", None)
    bench_results.seed_sqlite(var_dir)


def cast(server_url: str):
    """Legal's approved adapter served on the deployment; a key of Legal and one
    of Finance (which calls Legal's adapter through a grant)."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from core.models import Department, Membership, Role
    from serving.models import AdapterGrant, GrantStatus, InferenceKey, ServedAdapter
    from tests.factories import make_adapter, make_approved_version
    from tests.serving.conftest import make_deployment
    from tests.support.adapters import AdapterSpec

    users = get_user_model().objects
    admin = users.create_user("root", is_staff=True, is_superuser=True)
    member, approver = users.create_user("lena"), users.create_user("alex")
    legal = Department.objects.create(slug="legal", name="Legal")
    finance = Department.objects.create(slug="finance", name="Finance")
    Membership.objects.create(user=member, department=legal, role=Role.MEMBER)
    Membership.objects.create(user=approver, department=legal, role=Role.APPROVER)
    adapter = make_adapter(member, legal, name=ADAPTER, served_name=ADAPTER)
    version = make_approved_version(member, approver, adapter, AdapterSpec(seed=1))
    var_dir = Path(os.environ["VAR_DIR"])
    deployment = make_deployment(admin, [server_url], var_dir / "volume", name=DEPLOYMENT)
    ServedAdapter.objects.create(
        deployment=deployment, adapter=adapter, version=version, served_path="/bench"
    )
    AdapterGrant.objects.create(
        adapter=adapter,
        served_name=adapter.served_name,
        department=finance,
        status=GrantStatus.APPROVED,
        expires_at=timezone.now() + timedelta(days=1),
        requested_by=admin,
        decided_by=approver,
        decided_at=timezone.now(),
    )
    for department, secret in ((legal, KEYS["legal"]), (finance, KEYS["finance"])):
        InferenceKey.objects.create(
            department=department,
            name="bench",
            prefix=secret[:12],
            secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
            created_by=admin,
            expires_at=timezone.now() + timedelta(days=1),
        )
    return deployment


def start_receiver(port: int, log: Path) -> subprocess.Popen:
    command = [
        str(Path(sys.executable).with_name("gunicorn")),
        "config.wsgi:application",
        f"--bind=127.0.0.1:{port}",
        "--workers=2",
        "--graceful-timeout=1",
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=os.environ.copy(), stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/livez", timeout=2).status_code == 200:
                return process
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gunicorn did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)


def receiver_workers(master: int) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-P", str(master)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [int(pid) for pid in found]


def ledger() -> dict:
    from django.db import connections
    from django.db.models import Count, Sum

    from observability.models import DailyTokens, MeteredRequest

    connections.close_all()  # a fresh read of what the receiver committed
    raw = MeteredRequest.objects.aggregate(
        n=Count("pk"), p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    days = DailyTokens.objects.aggregate(
        n=Sum("requests"), p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    per_caller = {
        (row["department__slug"] or "-", row["served_name"]): row["n"]
        for row in DailyTokens.objects.values("department__slug", "served_name").annotate(
            n=Sum("requests")
        )
    }
    return {
        "requests": raw["n"] or 0,
        "prompt": raw["p"] or 0,
        "completion": raw["c"] or 0,
        "day_requests": days["n"] or 0,
        "day_prompt": days["p"] or 0,
        "day_completion": days["c"] or 0,
        "per_caller": per_caller,
    }


def run(args, out: bench_results.Results) -> dict:
    var_dir = Path(tempfile.mkdtemp(prefix="bench-metering-"))
    configure(var_dir)
    import django

    django.setup()
    from django.core.management import call_command

    from observability.otlp import metering_token
    from serving.door.haproxy import HAProxyFrontDoor
    from serving.door.routing import ReplicaView, ServedView, routing_table
    from serving.door.selectors import door_access
    from tests.support.adapters import AdapterSpec, write_adapter_dir
    from tests.support.haproxy import running_haproxy
    from tests.support.vllm_servers import (
        VLLMServer,
        ensure_tiny_model,
        ensure_vllm_installed,
        free_port,
    )

    call_command("migrate", verbosity=0)
    ensure_vllm_installed()
    model_dir = ensure_tiny_model()
    receiver_port = free_port()
    server = VLLMServer(
        name="metering",
        model_dir=model_dir,
        log_dir=var_dir,
        served_name=SERVED_BASE,
        threads=args.threads,
        env={
            "SERVE_OTLP_TRACES_ENDPOINT": (
                f"http://127.0.0.1:{receiver_port}/otlp/{DEPLOYMENT}/v1/traces"
            ),
            "SERVE_OTLP_TOKEN": metering_token(DEPLOYMENT),
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    deployment = cast(server.base_url)
    adapter_path = str(write_adapter_dir(var_dir / "adapter-v1", AdapterSpec(seed=1)))
    receiver = start_receiver(receiver_port, var_dir / "gunicorn.log")
    faults: list[str] = []
    try:
        started = time.monotonic()
        server.start_and_wait(300)
        print(f"vLLM ready in {time.monotonic() - started:.0f} s", flush=True)

        def load_adapter():
            with server.client(timeout=60) as client:
                assert client.load_adapter(ADAPTER, adapter_path).ok

        load_adapter()
        table = routing_table(
            deployment=DEPLOYMENT,
            base_model=SERVED_BASE,
            replicas=[ReplicaView(1, server.base_url, down=False, loaded={ADAPTER: adapter_path})],
            served=[ServedView(ADAPTER, adapter_path, held=False)],
        )
        door = HAProxyFrontDoor(var_dir / "gw", listen=f"127.0.0.1:{free_port()}")
        door.write(table)
        traffic = Traffic(f"http://{door.listen}", args.clients, args.streamed)
        quarter = args.requests // 4
        lives: list[tuple[int, int]] = []
        began = time.monotonic()
        with running_haproxy(door, log=var_dir / "haproxy.log", access=door_access(deployment)):
            traffic.run(0, quarter)

            def reload_door():
                time.sleep(0.5)
                faults.append(door._reload(table, {}))

            reloader = threading.Thread(target=reload_door)
            reloader.start()
            traffic.run(quarter, quarter)
            reloader.join()

            stop_killing = threading.Event()

            def kill_receiver_workers():
                # The first kill as the quarter starts (spans of the one before
                # are still arriving), then one every 1.5 s: on a quiet machine
                # a small quarter ends before a first wait would.
                while True:
                    for pid in receiver_workers(receiver.pid)[:1]:
                        os.kill(pid, signal.SIGKILL)
                        faults.append(f"receiver worker {pid} SIGKILLed")
                    if stop_killing.wait(1.5):
                        return

            killer = threading.Thread(target=kill_receiver_workers)
            killer.start()
            traffic.run(2 * quarter, quarter)
            stop_killing.set()
            killer.join()

            lives.append(vllm_totals(server.base_url))
            server.stop()  # SIGTERM, no request in flight
            server.start_and_wait(300)
            faults.append("replica restarted (SIGTERM)")
            load_adapter()
            traffic.run(3 * quarter, args.requests - 3 * quarter)
            lives.append(vllm_totals(server.base_url))
        seconds = time.monotonic() - began
        vllm = (sum(p for p, _ in lives), sum(c for _, c in lives))
        deadline = time.monotonic() + args.settle
        seen = ledger()
        while (seen["prompt"], seen["completion"]) != vllm and time.monotonic() < deadline:
            time.sleep(1)
            seen = ledger()
    finally:
        server.stop()
        receiver.terminate()
        receiver.wait(15)

    told = traffic.told
    table = out.table(
        "totals",
        ["count", "metered (ledger)", "metered (day rows)", "vLLM's totals", "clients told"],
        title=f"{args.requests} requests ({told['streamed']} streamed), "
        f"{args.clients} clients, through a door reload, receiver kills and a replica restart",
    )
    table.row("requests", seen["requests"], seen["day_requests"], "–", told["ok"])
    table.row("prompt tokens", seen["prompt"], seen["day_prompt"], vllm[0], told["prompt"])
    table.row(
        "completion tokens", seen["completion"], seen["day_completion"], vllm[1], told["completion"]
    )
    callers = out.table("callers", ["calling department", "model", "requests"])
    for (department, model), n in sorted(seen["per_caller"].items()):
        callers.row(department, model, n)
    equal = (
        (seen["prompt"], seen["completion"])
        == vllm
        == (
            seen["day_prompt"],
            seen["day_completion"],
        )
    )
    out.verdict(
        "metered tokens = vLLM's totals",
        1.0 if equal else 0.0,
        target="equal",
        met=equal,
        unit="",
    )
    out.headline(
        "Tokens metered per caller through faults",
        f"{seen['prompt'] + seen['completion']} of vLLM's {vllm[0] + vllm[1]} tokens",
        "vLLM's own Prometheus totals",
        "equal",
    )
    for fault in faults:
        out.note(fault)
    out.note(f"{told['failed']} client requests failed; traffic took {seconds:.0f} s")
    out.data.update(
        {
            "requests": args.requests,
            "ok": told["ok"],
            "failed": told["failed"],
            "streamed": told["streamed"],
            "metered": [seen["prompt"], seen["completion"]],
            "metered_days": [seen["day_prompt"], seen["day_completion"]],
            "metered_requests": seen["requests"],
            "vllm": list(vllm),
            "told": [told["prompt"], told["completion"]],
            "faults": faults,
            "seconds": seconds,
        }
    )
    print(json.dumps(out.data, indent=2), flush=True)
    return out.data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--streamed", type=float, default=0.34, help="share of streamed requests")
    parser.add_argument("--threads", type=int, default=1, help="vLLM's torch threads")
    parser.add_argument(
        "--settle", type=float, default=120.0, help="seconds to wait for the last spans"
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.clients, args.settle = 80, 2, 60.0
    out = bench_results.Results("metering", args)
    data = run(args, out)
    out.write()
    return 0 if data["metered"] == data["vllm"] == data["metered_days"] else 1


if __name__ == "__main__":
    sys.exit(main())
