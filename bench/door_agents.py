"""Doors that pull their state: how soon a change reaches 1 door and 3 doors,
and a promotion through 3 doors against 1, each beside its baseline from the
same run.

    .venv/bin/python -m bench.door_agents [--rounds 40] [--promotions 6] [--smoke] [--json PATH]
    DATABASE_URL=postgres://… .venv/bin/python -m bench.door_agents

Real HAProxy doors, each with its agent as a process of its own
(serving/door/agent.py), pulling from the control plane (the product's WSGI
application on a threaded server here) in front of two stand-in replicas
(tests/support/vllm_standin.py). What is timed:

  propagation   a new key written into a deployment's door state (the
                PulledFrontDoor's apply_access, as the access sync does),
                until every door of the deployment answers 200 for it (each
                door polled every 5 ms): to 1 door and to 3 doors. Baseline:
                the same change pushed by a worker straight into one door's
                runtime socket (HAProxyFrontDoor, `make run`'s way), until
                that door answers 200.
  promotion     a new adapter (a fresh served name, no swap), from the
                rollout's start (the product's engine, in this process) until
                it answers 200 through every door: through 1 door and through
                3 doors, alternating (target: 3 doors within 1.1 x 1 door).

Printed: p50 and p99 of each, and the ratios. The host is shared: the load
average is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
import uuid

import requests

from bench import results as bench_results
from bench.door_overhead import percentile
from bench.scale_support import deployment_for, setup
from tests.support.door_agents import Door, start_agent, stop_agent, wait_for
from tests.support.haproxy import running_haproxy
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import running_fleet

LEASE = 10.0


def serve_control_plane() -> tuple[str, object]:
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    port = free_port()
    server = ThreadedWSGIServer(("127.0.0.1", port), Quiet, allow_reuse_address=True)
    server.set_app(WSGIHandler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}", server


def answers(door_url: str, secret: str) -> int:
    return requests.post(
        door_url + "/v1/completions",
        json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    ).status_code


def access_with(deployment, secret: str):
    """The deployment's access table with one more key, as a sync computes it."""
    import hashlib
    from dataclasses import replace

    from serving.door.callers import CallerKey
    from serving.door.selectors import door_access

    access = door_access(deployment)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    keys = {
        **access.keys,
        digest: CallerKey(key_id=1, department="legal", expires_at=int(time.time()) + 3600),
    }
    return replace(
        access,
        open=False,
        keys=keys,
        allowed=access.allowed | {("legal", deployment.base_model_name)},
    )


def until_all_answer(urls: list[str], secret: str, started: float) -> float:
    for url in urls:
        wait_for(lambda url=url: answers(url, secret) == 200, timeout=30, step=0.005)
    return (time.monotonic() - started) * 1000


def figures(values: list[float]) -> dict:
    return {
        "p50_ms": round(statistics.median(values), 1),
        "p99_ms": round(percentile(values, 99), 1),
        "n": len(values),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="propagation rounds per case")
    parser.add_argument("--promotions", type=int, default=6, help="promotions per case")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.promotions = 3, 1

    cast = setup("door-agents", args.database_url)
    from django.conf import settings

    from serving.api.doors import door_token
    from serving.door.haproxy import HAProxyFrontDoor
    from serving.door.selectors import routing_table_for
    from serving.door.services import door_sync, front_door_for
    from serving.models import RolloutStatus
    from serving.replica_rows import replicas_sync
    from serving.rollouts.engine import rollout_execute
    from serving.services.promotions import promotion_create
    from tests.conftest import actor
    from tests.factories import make_adapter, make_approved_version
    from tests.support.adapters import AdapterSpec

    results: dict = {"load_average": os.getloadavg()[0]}
    with contextlib.ExitStack() as stack, running_fleet(2) as fleet:
        settings.SERVING_DOOR_LEASE_SECONDS = LEASE
        url, server = serve_control_plane()
        stack.callback(server.shutdown)
        doors: dict[str, list[Door]] = {}
        for name, count in (("one-door", 1), ("three-doors", 3)):
            deployment = deployment_for(cast, name, fleet.urls)
            deployment.open_door = True
            deployment.save(update_fields=["open_door"])
            settings.SERVING_DOORS = {**settings.SERVING_DOORS, name: "pull"}
            replicas_sync(deployment)
            door_sync(deployment)
            token = cast.var_dir / f"{name}.token"
            token.write_text(door_token(name))
            fronts = [
                Door(f"{name}-{i}", cast.var_dir / f"{name}-{i}", f"127.0.0.1:{free_port()}")
                for i in range(count)
            ]
            peers = ",".join(f"{d.name}=127.0.0.1:{free_port()}" for d in fronts)
            for front in fronts:
                start_agent(front, name, url, token, peers if count > 1 else "", LEASE)
                stack.callback(stop_agent, front)
            for front in fronts:
                wait_for(lambda front=front: front.ready() == 200, timeout=60, step=0.1)
            doors[name] = fronts

        # The baseline: one door a worker drives through its socket.
        direct = cast.var_dir / "direct"
        baseline_deployment = deployment_for(cast, "direct", fleet.urls)
        replicas_sync(baseline_deployment)
        local = HAProxyFrontDoor(direct, listen=f"127.0.0.1:{free_port()}")
        local.write(routing_table_for(baseline_deployment))
        stack.enter_context(running_haproxy(local, log=direct / "haproxy.log"))

        propagation: dict[str, list[float]] = {"direct": [], "one-door": [], "three-doors": []}
        for round_ in range(args.rounds):
            order = ["direct", "one-door", "three-doors"]
            order = order[round_ % 3 :] + order[: round_ % 3]
            for case in order:
                secret = f"sk-{uuid.uuid4().hex}"
                if case == "direct":
                    access = access_with(baseline_deployment, secret)
                    started = time.monotonic()
                    local.apply_access(access)
                    urls = [f"http://{local.listen}"]
                else:
                    from serving.models import Deployment

                    deployment = Deployment.objects.get(name=case)
                    access = access_with(deployment, secret)
                    started = time.monotonic()
                    front_door_for(deployment).apply_access(access)
                    urls = [front.url for front in doors[case]]
                propagation[case].append(until_all_answer(urls, secret, started))
        results["propagation"] = {case: figures(v) for case, v in propagation.items()}

        # Promotions: a new adapter each, through 1 door and through 3.
        from serving.models import Deployment

        for name in doors:
            deployment = Deployment.objects.get(name=name)
            deployment.open_door = True
            deployment.save(update_fields=["open_door"])
            door_sync(deployment)
        promotion: dict[str, list[float]] = {"one-door": [], "three-doors": []}
        for round_ in range(args.promotions):
            order = ["one-door", "three-doors"] if round_ % 2 == 0 else ["three-doors", "one-door"]
            for case in order:
                deployment = Deployment.objects.get(name=case)
                served = f"bench-{case}-{round_}"
                adapter = make_adapter(
                    cast.member, cast.department, name=served, served_name=served
                )
                version = make_approved_version(
                    cast.member, cast.approver, adapter, AdapterSpec(seed=round_ + 10)
                )
                started = time.monotonic()
                made = promotion_create(
                    actor=actor(cast.member), deployment=deployment, version=version
                )
                status = rollout_execute(made.rollouts.get().pk, "bench")
                assert status == RolloutStatus.SUCCEEDED, status
                for front in doors[case]:
                    wait_for(
                        lambda front=front, served=served: (
                            requests.post(
                                front.url + "/v1/completions",
                                json={"model": served, "prompt": "x", "max_tokens": 1},
                                timeout=30,
                            ).status_code
                            == 200
                        ),
                        timeout=30,
                        step=0.005,
                    )
                promotion[case].append((time.monotonic() - started) * 1000)
        results["promotion"] = {case: figures(v) for case, v in promotion.items()}
        one, three = (statistics.median(promotion[c]) for c in ("one-door", "three-doors"))
        results["promotion"]["ratio_3_to_1"] = round(three / one, 2)
    results["load_average_after"] = os.getloadavg()[0]

    report(results, args)


def report(results: dict, args) -> None:
    out = bench_results.Results("door_agents", args)
    load = f"load average {results['load_average']:.1f} -> {results['load_average_after']:.1f}"
    table = out.table(
        "propagation",
        ["case", "p50 ms", "p99 ms", "n"],
        "a new key written, until every door of the deployment takes it",
    )
    labels = {
        "direct": "baseline: one door driven through its socket",
        "one-door": "1 door pulling",
        "three-doors": "3 doors pulling",
    }
    for case, label in labels.items():
        fig = results["propagation"][case]
        table.row(label, fig["p50_ms"], fig["p99_ms"], fig["n"])
    worst = results["propagation"]["three-doors"]["p99_ms"]
    out.verdict(
        "propagation to 3 doors, p99", worst, target="<= 1000 ms", met=worst <= 1000, unit="ms"
    )
    table = out.table(
        "promotion",
        ["case", "p50 ms", "p99 ms", "n"],
        "a new adapter, from the rollout's start until it answers through every door",
    )
    for case in ("one-door", "three-doors"):
        fig = results["promotion"][case]
        table.row(labels[case], fig["p50_ms"], fig["p99_ms"], fig["n"])
    ratio = results["promotion"]["ratio_3_to_1"]
    out.verdict(
        "promotion through 3 doors / 1 door, p50", ratio, target="<= 1.1x", met=ratio <= 1.1
    )
    out.note(load)
    out.write()
    for name, rows in (
        ("propagation", results["propagation"]),
        ("promotion", results["promotion"]),
    ):
        print(f"{name}: {rows}")
    print(f"{load}; promotion 3 doors / 1 door at p50: {ratio:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
