"""Where a rollout's own time goes, under cProfile, against real vLLM replicas.

    .venv/bin/python -m scripts.profile_rollout --replica-urls http://127.0.0.1:8100 --rounds 20

Each round promotes a NEW adapter through the API (as bench/promote_to_served.py
does) and runs the rollout in this process (rollout_execute, no broker, no
worker: the broker's pickup is timed by promote_to_served), then retires it.
Prints the wall time of the promotion call and of the rollout per round, and
the functions that took the rollout's time, cumulative, from the profile of
every timed round. What it found is in docs/internals-rollout-speed.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.product_path import Cast, configure_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replica-urls", required=True, help="comma-separated vLLM URLs")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--top", type=int, default=40, help="rows of the profile to print")
    parser.add_argument("--sort", default="cumulative")
    parser.add_argument("--queries", action="store_true", help="print the last round's SQL")
    parser.add_argument(
        "--api", action="store_true", help="profile the promotion API call instead of the rollout"
    )
    args = parser.parse_args(argv)
    urls = [u.strip() for u in args.replica_urls.split(",") if u.strip()]

    var_dir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    configure_env(var_dir, None)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from serving.rollouts.engine import rollout_execute
    from tests.support.adapters import AdapterSpec, write_adapter_dir
    from tests.support.vllm_servers import ensure_tiny_model

    try:
        call_command("migrate", verbosity=0)
        cast = Cast()
        volume = var_dir / "volume"
        volume.mkdir()
        deployment = cast.deployment(
            "profile", urls, volume, ensure_tiny_model(), max_loras=2, max_cpu_loras=4
        )
        profile = cProfile.Profile()
        api_ms, api_cpu_ms, rollout_ms = [], [], []
        for round_no in range(args.warmup + args.rounds):
            timed = round_no >= args.warmup
            name = f"prof-{round_no:02d}-{uuid.uuid4().hex[:4]}"
            files = write_adapter_dir(
                var_dir / "sources" / name, AdapterSpec(r=args.rank, seed=round_no)
            )
            version = cast.approved_version(name, files)
            if timed and args.api:
                profile.enable()
            cpu = time.process_time()
            with CaptureQueriesContext(connection) as api_captured:
                t0, t1, rollout_id = cast.promote(deployment.name, version)
            cpu = time.process_time() - cpu
            if timed and args.api:
                profile.disable()
            t2 = time.perf_counter()
            if timed and not args.api:
                profile.enable()
            with CaptureQueriesContext(connection) as captured:
                status = rollout_execute(rollout_id, "profiler")
            if timed and not args.api:
                profile.disable()
            t3 = time.perf_counter()
            if status != "succeeded":
                raise RuntimeError(f"rollout {rollout_id}: {status}")
            if timed:
                api_ms.append((t1 - t0) * 1000)
                api_cpu_ms.append(cpu * 1000)
                rollout_ms.append((t3 - t2) * 1000)
            retire_id = cast.retire(deployment, version)
            rollout_execute(retire_id, "profiler")
        print(
            f"{len(urls)} replica(s), {args.rounds} rounds: promotion API call median "
            f"{statistics.median(api_ms):.1f} ms (CPU {statistics.median(api_cpu_ms):.1f} ms: "
            "less moved by a loaded host), rollout_execute median "
            f"{statistics.median(rollout_ms):.1f} ms (min {min(rollout_ms):.1f})"
        )
        print(f"SQL statements of the last promotion API call: {len(api_captured)}")
        print(f"SQL statements of the last rollout: {len(captured.captured_queries)}")
        if args.queries:
            for query in (api_captured if args.api else captured).captured_queries:
                print(f"  {query['time']:>6}s  {query['sql'][:160]}")
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats(args.sort).print_stats(args.top)
        print(out.getvalue())
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
