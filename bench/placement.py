"""Placement at fleet scale on the vLLM stand-in, each figure beside a baseline from the same run.

    .venv/bin/python -m bench.placement [--adapters 500] [--replicas 16] [--cpu-loras 64]
        [--per-adapter 2] [--ticks 5] [--database-url postgres://.../bench_placement]
        [--smoke] [--json PATH]

compute  serving.rules.placement_plan for every adapter from scratch, timed (target < 1 s);
         beside it modulo hashing, the baseline, on the same adapters and replicas.
tick     The reconcile brings the fleet to its placement (every adapter on
         --per-adapter replicas, loaded and verified there), then an in-sync tick
         is measured: wall time and SQL statements, everything the tick runs
         (the observability hook after it included); target <= 10 statements and
         < 1 s. Beside it the same tick on a second fleet whose adapters have no
         bounds (every adapter on every replica: the product before placement).
loss     One replica stops answering (503 to everything). Placement moves only
         what it held, within room: the placements that move, against the
         placements before (target <= 1/replicas), beside what modulo hashing and
         rendezvous hashing recomputed from scratch would move; then every adapter
         is asked through a real HAProxy front door (serving/door/haproxy/)
         until each answers, timed from the loss (target <= 10 s).

Replicas are the vLLM stand-in (tests/support/vllm_standin.py), one asyncio
process, one port each, no sleeps; their /metrics show no requests (the
tick's own probes are not demand).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench import results as bench_results

IDLE_METRICS = (
    "# TYPE vllm:lora_requests_info gauge\n"
    'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
    'waiting_lora_adapters=""} 1.0\n'
)


def modulo_placement(names: list[str], keys: list[int], per: int) -> dict[str, set[int]]:
    """The baseline: replica (hash(name) + i) mod N for i < per."""
    keys = sorted(keys)
    placed = {}
    for name in names:
        h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
        placed[name] = {keys[(h + i) % len(keys)] for i in range(min(per, len(keys)))}
    return placed


def moved(before: dict[str, set[int]], after: dict[str, set[int]]) -> int:
    """Placements on a replica the adapter was not on before."""
    return sum(len(after[n] - before[n]) for n in before)


def _compute(args, out) -> dict:
    from serving.rules.placement_plan import ReplicaSlot, Settings, Wish, place

    names = [f"adapter-{i:04d}" for i in range(args.adapters)]
    wishes = [Wish(n, max_replicas=args.per_adapter) for n in names]
    slots = [ReplicaSlot(k, args.cpu_loras) for k in range(1, args.replicas + 1)]
    unlimited = Settings(churn_budget=0)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        result = place(wishes, slots, settings=unlimited, now=time.time(), elapsed=10)
        times.append(time.perf_counter() - started)
    modulo_times = []
    for _ in range(5):
        started = time.perf_counter()
        modulo_placement(names, [s.key for s in slots], args.per_adapter)
        modulo_times.append(time.perf_counter() - started)
    placed = sum(len(s.replicas) for s in result.states.values())
    table = out.table(
        "compute",
        ["placement", "adapters", "replicas", "placements", "median s", "max s"],
        "placement computed from scratch",
    )
    table.row("rendezvous, with room and bounds", args.adapters, args.replicas, placed,
              statistics.median(times), max(times))  # fmt: skip
    table.row("modulo hashing (baseline)", args.adapters, args.replicas,
              args.adapters * args.per_adapter, statistics.median(modulo_times),
              max(modulo_times))  # fmt: skip
    out.verdict("placement computed", max(times), target="< 1 s", met=max(times) < 1.0, unit="s")
    print(
        f"compute: {placed} placements of {args.adapters} adapters on {args.replicas} replicas "
        f"in {statistics.median(times) * 1000:.1f} ms median ({max(times) * 1000:.1f} max); "
        f"modulo hashing {statistics.median(modulo_times) * 1000:.1f} ms"
    )
    return {"seconds": max(times)}


def _record_fingerprints(deployment, fleet, served) -> None:
    """What the rollouts would have recorded: each version's probe, from a
    replica that holds it (tests/support/fleet.fingerprints_record, placed)."""
    from serving.fanout import client_for
    from serving.models import Replica, VersionFingerprint
    from serving.replica_rows import replicas_sync
    from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe

    replicas_sync(deployment)  # the rows exist before the first reconcile
    rows = {r.base_url: r for r in Replica.objects.filter(deployment=deployment)}
    fingerprints = []
    for s in served:
        name = s.adapter.served_name
        holder = next(r for r in fleet.replicas if name in r.adapters)
        row = rows[holder.base_url]
        with client_for(row, deployment) as client:
            answer = client.probe(name, prompt=PROBE_PROMPT, max_tokens=PROBE_TOKENS)
        probe = Probe.from_body(answer.body)
        fingerprints.append(
            VersionFingerprint(
                deployment=deployment,
                version_id=s.version_id,
                probe=probe.as_dict(),
                recorded_from=row,
                recorded_from_url=row.base_url,
            )
        )
    VersionFingerprint.objects.bulk_create(fingerprints, ignore_conflicts=True)


def _placements(deployment) -> dict[str, set[int]]:
    from serving.models import ServedAdapter
    from serving.rules.placement_plan import State

    return {
        row.adapter.served_name: set(State.from_dict(row.placement).replicas)
        for row in ServedAdapter.objects.filter(deployment=deployment).select_related("adapter")
    }


def _in_sync_ticks(deployment, count: int, replicas: int):
    from serving.reconcile.tick import reconcile_deployment
    from tests.support.fleet import measure

    walls, statements = [], []
    for _ in range(count):
        m = measure(lambda: reconcile_deployment(deployment.pk, "bench"))
        assert m.result.in_sync == replicas and not m.result.repairs, m.result
        walls.append(m.seconds)
        statements.append(m.statements)
    return walls, statements


def _until_in_sync(deployment, limit: int = 40, *, loads_only: bool = False) -> int:
    """Ticks until nothing is left to do (`loads_only`: until nothing is left
    to load or unload; the sampled fingerprint check may still record some)."""
    from serving.reconcile.tick import reconcile_deployment

    for tick in range(1, limit + 1):
        report = reconcile_deployment(deployment.pk, "bench")
        if not report.repairs and (loads_only or report.in_sync == report.replicas_up):
            return tick
    raise RuntimeError(f"{deployment.name}: not in sync after {limit} ticks")


def _ask_all(listen: str, names: list[str]) -> list[str]:
    """The adapters that did not answer 200 through the front door."""
    url = f"http://{listen}/v1/completions"

    def ask(name: str) -> str | None:
        try:
            answer = requests.post(
                url, json={"model": name, "prompt": "hi", "max_tokens": 1}, timeout=10
            )
        except requests.RequestException:
            return name
        return None if answer.status_code == 200 else name

    with ThreadPoolExecutor(max_workers=16) as pool:
        return [n for n in pool.map(ask, names) if n is not None]


def run(args, out) -> None:
    from bench.scale_support import deployment_for, setup

    cast = setup("placement", args.database_url)  # Django first: what follows needs it
    from django.conf import settings

    from serving.door.selectors import routing_table_for
    from serving.door.services import front_door_for
    from serving.models import ServedAdapter
    from serving.reconcile.tick import reconcile_deployment
    from serving.rules.placement_plan import ReplicaSlot, Settings, State, Wish, place
    from tests.support.fleet import served_adapters_clone, standin_fleet, standin_load
    from tests.support.haproxy import open_access, running_haproxy
    from tests.support.vllm_servers import free_port

    figures = _compute(args, out)
    options = {"max_cpu_loras": args.cpu_loras}
    with (
        standin_fleet(args.replicas, **options) as fleet,
        standin_fleet(args.replicas, **options) as bare_fleet,
    ):
        for replica in [*fleet.replicas, *bare_fleet.replicas]:
            replica.metrics_text = IDLE_METRICS
        # The baseline: the same adapters without bounds, every one on every replica.
        bare = deployment_for(cast, "everywhere", bare_fleet.urls)
        bare.max_cpu_loras = args.cpu_loras
        bare.save(update_fields=["max_cpu_loras"])
        bare_served = served_adapters_clone(bare, cast.version, args.adapters, prefix="all")
        for replica in bare_fleet.replicas:
            standin_load(replica, bare_served)
        _record_fingerprints(bare, bare_fleet, bare_served)
        _until_in_sync(bare)
        bare_walls, bare_sql = _in_sync_ticks(bare, args.ticks, args.replicas)

        deployment = deployment_for(cast, "placed", fleet.urls)
        deployment.max_cpu_loras = args.cpu_loras
        deployment.save(update_fields=["max_cpu_loras"])
        served = served_adapters_clone(deployment, cast.version, args.adapters, prefix="placed")
        ServedAdapter.objects.filter(deployment=deployment).update(max_replicas=args.per_adapter)
        # The first fill has no churn limit; the loss below runs with the default budget.
        budget = settings.SERVING_PLACEMENT_CHURN_BUDGET
        settings.SERVING_PLACEMENT_CHURN_BUDGET = 0
        started = time.perf_counter()
        fill_ticks = _until_in_sync(deployment, loads_only=True)
        fill_seconds = time.perf_counter() - started
        settings.SERVING_PLACEMENT_CHURN_BUDGET = budget
        held = [len(r.adapters) for r in fleet.replicas]
        assert max(held) <= args.cpu_loras, held
        _record_fingerprints(deployment, fleet, served)
        _until_in_sync(deployment)
        walls, sql = _in_sync_ticks(deployment, args.ticks, args.replicas)

        tick = out.table(
            "tick",
            ["deployment", "adapters held per replica", "in-sync tick median s", "max s",
             "SQL statements"],
            "an in-sync reconcile tick",
        )  # fmt: skip
        tick.row(f"placement, {args.per_adapter} replicas per adapter",
                 f"{min(held)}-{max(held)}", statistics.median(walls), max(walls),
                 max(sql))  # fmt: skip
        tick.row("no bounds, every adapter on every replica (baseline)", args.adapters,
                 statistics.median(bare_walls), max(bare_walls), max(bare_sql))  # fmt: skip
        out.verdict("in-sync tick statements", max(sql), target="<= 10", met=max(sql) <= 10,
                    unit="")  # fmt: skip
        out.verdict("in-sync tick time", max(walls), target="< 1 s", met=max(walls) < 1.0,
                    unit="s")  # fmt: skip
        print(
            f"fill: {args.adapters * args.per_adapter} placements loaded and verified in "
            f"{fill_ticks} ticks, {fill_seconds:.1f} s; replicas hold {min(held)}-{max(held)} "
            f"(max_cpu_loras {args.cpu_loras})"
        )
        print(
            f"in-sync tick with placement: {statistics.median(walls) * 1000:.0f} ms median, "
            f"{max(walls) * 1000:.0f} max, {max(sql)} SQL; without bounds (baseline): "
            f"{statistics.median(bare_walls) * 1000:.0f} ms, {max(bare_sql)} SQL"
        )

        # -- loss, through a real front door
        listen = f"127.0.0.1:{free_port()}"
        work = Path(tempfile.mkdtemp(prefix="placement-gateway-"))
        settings.SERVING_DOOR_DIR = work
        settings.SERVING_DOORS = {deployment.name: listen}
        # Open (no keys): the bench measures placement, not access.
        deployment.open_door = True
        deployment.save(update_fields=["open_door"])
        door = front_door_for(deployment)
        door.write(routing_table_for(deployment))
        names = [s.adapter.served_name for s in served]
        with running_haproxy(door, log=work / "haproxy.log", access=open_access()):
            reconcile_deployment(deployment.pk, "bench")  # routes as the table says
            failing = _ask_all(listen, names)
            assert not failing, f"{len(failing)} did not answer before the loss: {failing[:5]}"
            before = _placements(deployment)
            lost_url = fleet.replicas[0].base_url
            from serving.models import Replica

            lost = Replica.objects.get(deployment=deployment, base_url=lost_url)
            on_lost = sum(1 for keys in before.values() if lost.pk in keys)
            lost_at = time.monotonic()
            fleet.replicas[0].unavailable = 10**9
            answered_in = None
            ticks_after = 0
            while time.monotonic() - lost_at < 60:
                reconcile_deployment(deployment.pk, "bench")
                ticks_after += 1
                failing = _ask_all(listen, names)
                if not failing:
                    answered_in = time.monotonic() - lost_at
                    break
            for _ in range(3):  # what the churn budget left, if anything
                reconcile_deployment(deployment.pk, "bench")
            after = _placements(deployment)
        total = sum(len(k) for k in before.values())
        product_moved = moved(before, after)
        no_room = sum(
            1
            for row in ServedAdapter.objects.filter(deployment=deployment)
            if State.from_dict(row.placement).reason == "no_room"
        )
        keys = sorted({k for ks in before.values() for k in ks} | {lost.pk})
        survivors = [k for k in keys if k != lost.pk]
        modulo_before = modulo_placement(names, keys, args.per_adapter)
        modulo_after = modulo_placement(names, survivors, args.per_adapter)
        wishes = [Wish(n, max_replicas=args.per_adapter) for n in names]
        unlimited = Settings(churn_budget=0)
        scratch_before = place(wishes, [ReplicaSlot(k, args.cpu_loras) for k in keys],
                               settings=unlimited, now=0, elapsed=0)  # fmt: skip
        scratch_after = place(wishes, [ReplicaSlot(k, args.cpu_loras) for k in survivors],
                              settings=unlimited, now=0, elapsed=0)  # fmt: skip

        def sets(result):
            return {n: set(s.replicas) for n, s in result.states.items()}

        loss = out.table(
            "loss",
            ["placement", "placements before", "moved", "moved share", "target share"],
            "one replica of the fleet lost: placements that move to another replica",
        )
        share = product_moved / total if total else 0.0
        limit = 1 / args.replicas
        loss.row("product (rendezvous, sticky, with room)", total, product_moved, share, limit)
        loss.row("rendezvous recomputed from scratch", total,
                 moved(sets(scratch_before), sets(scratch_after)),
                 moved(sets(scratch_before), sets(scratch_after)) / total, limit)  # fmt: skip
        loss.row("modulo hashing (baseline)", total, moved(modulo_before, modulo_after),
                 moved(modulo_before, modulo_after) / total, limit)  # fmt: skip
        out.verdict("placements moved after one replica lost", share,
                    target=f"<= 1/{args.replicas}", met=share <= limit, unit="")  # fmt: skip
        met = answered_in is not None and answered_in <= 10
        out.verdict("every adapter answers through the front door after the loss",
                    answered_in if answered_in is not None else float("inf"),
                    target="<= 10 s", met=met, unit="s")  # fmt: skip
        answers = out.table(
            "answers", ["measure", "value"], "after the loss, through the front door"
        )
        answers.row("placements the lost replica held", on_lost)
        answers.row("adapters with no room left (served on fewer replicas)", no_room)
        answers.row("reconcile ticks until every adapter answered", ticks_after)
        answers.row("seconds from the loss until every adapter answered",
                    answered_in if answered_in is not None else "not within 60 s")  # fmt: skip
        out.headline(
            f"placement of {args.adapters} adapters on {args.replicas} replicas, one lost",
            f"{share:.1%} of placements moved; all answered in "
            + (f"{answered_in:.1f} s" if answered_in is not None else "> 60 s"),
            f"modulo hashing moves {moved(modulo_before, modulo_after) / total:.0%}",
            f"<= {limit:.1%} and <= 10 s: " + ("met" if share <= limit and met else "not met"),
        )
        print(
            f"loss: the lost replica held {on_lost} of {total} placements; {product_moved} "
            f"moved ({share:.1%}, target <= {limit:.1%}), {no_room} adapters found no room for "
            f"their second replica; modulo hashing would move "
            f"{moved(modulo_before, modulo_after)} "
            f"({moved(modulo_before, modulo_after) / total:.0%}), rendezvous from scratch "
            f"{moved(sets(scratch_before), sets(scratch_after))}"
        )
        print(
            "every adapter answered through the front door "
            + (f"{answered_in:.1f} s after the loss" if answered_in is not None else "NOT in 60 s")
            + f" ({ticks_after} reconcile ticks)"
        )
        out.note(
            f"stand-in replicas (no sleeps); max_cpu_loras {args.cpu_loras}; churn budget "
            f"{budget} after the first fill (which had none); {figures['seconds'] * 1000:.0f} ms "
            "to compute the placement at worst"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--cpu-loras", type=int, default=64)
    parser.add_argument("--per-adapter", type=int, default=2)
    parser.add_argument("--ticks", type=int, default=5, help="in-sync ticks measured")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL database to recreate")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.adapters, args.replicas, args.cpu_loras, args.ticks = 40, 4, 24, 2
    out = bench_results.Results("placement", args)
    run(args, out)
    out.write()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
