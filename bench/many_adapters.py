"""Many adapters on one replica: cold and warm latency above max_cpu_loras,
beside the base model's latency measured in the same run.

    .venv/bin/python -m bench.many_adapters                    # 60 adapters, max_cpu_loras 4
    .venv/bin/python -m bench.many_adapters --adapters 200 --sweeps 3

One real vLLM server (tiny model, --max-loras 2 --max-cpu-loras 4) and a `celery
worker` process on the configured broker. N adapters are registered and approved
through the services and promoted through promotion_create, so every rollout goes
the product's way (gate, staging, load, verify), one after the other. Then,
`--sweeps` times over the adapters in promotion order, one-token completions,
each timed on the client:

  base   through the base model (the baseline, interleaved with the others)
  cold   through adapter i: evicted from the host cache by the adapters after it,
         so vLLM re-reads it from its lora_path first
  warm   through adapter i again at once: now in the host cache
  cache  round robin over max_cpu_loras adapters only (never evicted)

The gate's prediction for the next adapter (median, p95 of the replicas' recent
successful loads, serving.capacity.cold_load) is printed beside the measurement.
Everything lives in a throwaway VAR_DIR (SQLite) unless DATABASE_URL is set.
Real vLLM (no stand-in). --smoke: 5 adapters, one sweep; --replica-urls URL
uses a running server (started with --max-loras 2 --max-cpu-loras 4).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench import results as bench_results
from bench.product_path import (
    configure_env,
    percentile,
    route_to_queue,
    start_worker,
    stop_process,
    wait_worker_ready,
)

MAX_LORAS, MAX_CPU_LORAS = 2, 4


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), percentile(values, 95)


def _setup(server_url: str, volume: Path, model_dir: Path, count: int, scale: float):
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import SimpleUploadedFile

    from core.actors import Actor
    from core.models import Department, Membership, Role
    from registry.ingest.incoming import UploadedFiles
    from registry.services.adapters import adapter_create
    from registry.services.versions import version_register, version_transition
    from serving.services.deployments import deployment_create
    from tests.support.adapters import AdapterSpec, adapter_tar_gz

    User = get_user_model()
    admin = Actor(
        user=User.objects.create_user("bench-admin", is_staff=True, is_superuser=True),
        request_id="b",
    )
    member_user, approver_user = User.objects.create_user("m"), User.objects.create_user("a")
    department = Department.objects.create(slug="bench", name="Bench")
    Membership.objects.create(user=member_user, department=department, role=Role.MEMBER)
    Membership.objects.create(user=approver_user, department=department, role=Role.APPROVER)
    member = Actor(user=member_user, request_id="b")
    approver = Actor(user=approver_user, request_id="b")
    deployment = deployment_create(
        actor=admin,
        name="many",
        environment="bench",
        base_model_name="tiny-llama",
        base_model_path=str(model_dir),
        replica_urls=[server_url],
        volume_write_path=str(volume),
        volume_serve_path=str(volume),
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_CPU_LORAS,
        max_lora_rank=16,
    )
    versions = []
    for i in range(count):
        adapter = adapter_create(
            actor=member, department=department, name=f"a{i:03d}", base_model="tiny-llama"
        )
        archive = adapter_tar_gz(AdapterSpec(seed=1000 + i, scale=scale))
        upload = SimpleUploadedFile("adapter.tar.gz", archive, content_type="application/gzip")
        version = version_register(
            actor=member, adapter=adapter, source=UploadedFiles([upload])
        ).version
        version_transition(actor=member, version=version, action="submit")
        versions.append(version_transition(actor=approver, version=version, action="approve"))
    return member, deployment, versions


def _promote_all(member, deployment, versions, timeout: float = 120) -> float:
    """One after the other: the embedded SQLite database takes one writer at a time."""
    from serving.models import Rollout
    from serving.rules.transitions import ROLLOUT_TERMINAL
    from serving.services.promotions import promotion_create

    t0 = time.perf_counter()
    for version in versions:
        promotion = promotion_create(actor=member, deployment=deployment, version=version)
        rollout_id = promotion.rollouts.get().pk
        deadline = time.monotonic() + timeout
        while (rollout := Rollout.objects.get(pk=rollout_id)).status not in ROLLOUT_TERMINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout {rollout_id} still {rollout.status}")
            time.sleep(0.05)
        if rollout.status != "succeeded":
            raise RuntimeError(f"{version.adapter.served_name}: {rollout.error[:300]}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=60)
    parser.add_argument("--sweeps", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.05, help="adapter weight scale")
    parser.add_argument("--broker", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--replica-urls", default="", help="one running vLLM server (default: start one)"
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.adapters, args.sweeps = MAX_CPU_LORAS + 1, 1
    if args.adapters <= MAX_CPU_LORAS:
        parser.error(f"--adapters must exceed max_cpu_loras {MAX_CPU_LORAS}")

    var_dir = Path(tempfile.mkdtemp(prefix="bench-many-"))
    configure_env(var_dir, args.broker)
    import django

    django.setup()
    import requests
    from django.core.management import call_command

    from config.celery import app
    from serving.capacity import cold_load, deployment_tiers
    from tests.support.vllm_servers import ensure_tiny_model, start_servers, stop_all

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    route_to_queue(app, queue)
    log_dir = var_dir / "log"
    log_dir.mkdir(parents=True)
    call_command("migrate", verbosity=0)
    model_dir = ensure_tiny_model()
    if args.replica_urls:
        server_url = args.replica_urls.split(",")[0].strip()
    else:
        (server,) = start_servers(
            1, model_dir=model_dir, log_dir=log_dir, max_loras=MAX_LORAS,
            max_cpu_loras=MAX_CPU_LORAS,
        )  # fmt: skip
        server_url = server.base_url
    worker_log = log_dir / "worker.log"
    worker = start_worker(queue, worker_log)
    try:
        wait_worker_ready(worker_log)
        volume = var_dir / "volume"
        volume.mkdir()
        member, deployment, versions = _setup(
            server_url, volume, model_dir, args.adapters, args.scale
        )
        promote_seconds = _promote_all(member, deployment, versions)
        names = [v.adapter.served_name for v in versions]
        session = requests.Session()

        def completion_ms(model: str) -> float:
            body = {"model": model, "prompt": "The contract says", "max_tokens": 1}
            t0 = time.perf_counter()
            response = session.post(server_url + "/v1/completions", json=body, timeout=60)
            elapsed = (time.perf_counter() - t0) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{model}: {response.status_code} {response.text[:300]}")
            return elapsed

        base, cold, warm, cache = [], [], [], []
        completion_ms("tiny-llama")  # the first request pays warm-up
        for _ in range(args.sweeps):
            for name in names:
                base.append(completion_ms("tiny-llama"))
                cold.append(completion_ms(name))
                warm.append(completion_ms(name))
        resident = names[:MAX_CPU_LORAS]
        for name in resident:  # make them the host cache's content
            completion_ms(name)
        for i in range(len(cold)):
            cache.append(completion_ms(resident[i % len(resident)]))
        predicted = cold_load(deployment)
        tiers = deployment_tiers(deployment)
    except BaseException:
        args.keep = True
        raise
    finally:
        stop_process(worker)
        stop_all()
        if not args.keep:
            shutil.rmtree(var_dir, ignore_errors=True)
        else:
            print(f"kept {var_dir}")

    print()
    print(
        f"{args.adapters} adapters (r=8, q_proj+v_proj) on one vLLM replica, max_loras "
        f"{MAX_LORAS}, max_cpu_loras {MAX_CPU_LORAS}; {args.sweeps} sweep(s), "
        f"{len(cold)} requests per case; promoted in {promote_seconds:.1f} s"
    )
    print(f"tiers: {tiers.registered.used}/{tiers.registered.limit} registered, host cache "
          f"{tiers.host.used}/{tiers.host.limit}, batch limit {tiers.batch.limit}")  # fmt: skip
    out = bench_results.Results("many_adapters", args)
    out.note(
        f"{args.adapters} adapters on one real vLLM 0.32 replica (no stand-in), max_loras "
        f"{MAX_LORAS}, max_cpu_loras {MAX_CPU_LORAS}, {len(cold)} requests per case"
    )
    table = out.table("latency", ["case", "median ms", "p95 ms", "vs base"], "many adapters")
    print(f"{'case':<44}{'median ms':>10}{'p95 ms':>10}{'vs base':>9}")
    base_median, _ = _stats(base)
    for label, values in (
        ("base model (baseline)", base),
        ("cold: adapter evicted, re-read from disk", cold),
        ("warm: the same adapter again at once", warm),
        ("in cache: round robin over max_cpu_loras", cache),
    ):
        median, p95 = _stats(values)
        print(f"{label:<44}{median:>10.1f}{p95:>10.1f}{median / base_median:>8.2f}x")
        table.row(label, median, p95, f"{median / base_median:.2f}x")
    extra = [c - w for c, w in zip(cold, warm, strict=True)]
    extra_median, extra_p95 = _stats(extra)
    print(f"{'cold minus warm, paired':<44}{extra_median:>10.1f}{extra_p95:>10.1f}")
    print(
        f"{'gate prediction (load attempts)':<44}{predicted.median_ms:>10.1f}"
        f"{predicted.p95_ms:>10.1f}   from {predicted.samples} loads"
    )
    table.row("cold minus warm, paired", extra_median, extra_p95, "")
    cold_median, _ = _stats(cold)
    out.headline(
        f"{args.adapters} adapters through max_cpu_loras {MAX_CPU_LORAS}",
        f"{args.adapters} of {args.adapters} answer; cold {cold_median / base_median:.2f}× base",
        f"base model {base_median:.1f} ms",
    )
    table.row("gate prediction (load attempts)", predicted.median_ms, predicted.p95_ms, "")
    out.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
