"""A new vLLM pod turns ready -> it serves the promoted adapter: with the
EndpointSlice watch, beside the beat-driven reconcile it replaces.

    .venv/bin/python -m bench.new_pod_to_served [--rounds 10] [--interval 10]

Each round a NEW replica appears (a fake vLLM server on loopback: what is
timed is discovery and the reconcile, not vLLM's own 3-30 ms load) as a ready
endpoint in an EndpointSlice of the stand-in Kubernetes API server
(tests/support/k8s_apiserver.py, through the official client), and the clock
runs until that replica has the promoted adapter loaded.

  watch   the product: `EndpointSliceWatch` sees the event, writes the replica
          and enqueues the deployment's reconcile on commit; the enqueue runs
          the reconcile at once in a thread (a stand-in for an idle worker: no
          broker hop, which adds a few ms on Redis).
  beat    the baseline, as before this change (static or DNS discovery): the
          same reconcile, run by the product's real `celery beat` process
          (serving.reconcile_all every --interval seconds, the default
          SERVING_RECONCILE_INTERVAL_SECONDS) and a real `celery worker` process
          on the bench's own queue, pods appearing at random phases of the beat.
          Its rounds run after the others, while beat and worker run.
  direct  the reconcile's own cost: called as soon as the replica row exists.

The replicas are tests/support/vllm_standin.serve_standin: no load latency of its own
(latency model: zero), in every case alike. SQLite in a throwaway VAR_DIR.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench import results as bench_results
from bench.product_path import (
    route_to_queue,
    start_beat,
    start_worker,
    stop_process,
    wait_beat_ticking,
    wait_worker_ready,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _configure_env(var_dir: Path, interval: float) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["VAR_DIR"] = str(var_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_DEBUG"] = "true"
    os.environ["DJANGO_SECRET_KEY"] = "bench-only-secret-key"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ["KUBERNETES_WATCH_TIMEOUT_SECONDS"] = "60"
    # Read by the beat process's schedule (and everything else that reads it).
    os.environ["SERVING_RECONCILE_INTERVAL_SECONDS"] = f"{interval:g}"
    bench_results.seed_sqlite(var_dir)


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.002)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=float, default=10.0)
    bench_results.add_arguments(parser)
    options = parser.parse_args(argv)
    if options.smoke:
        options.rounds, options.interval = 1, 2.0

    var_dir = Path(tempfile.mkdtemp(prefix="bench-new-pod-"))
    _configure_env(var_dir, options.interval)
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.core.management import call_command

    from config.celery import app
    from core.actors import Actor
    from core.models import Department, Membership, Role
    from registry.ingest.incoming import UploadedFiles
    from registry.services.adapters import adapter_create
    from registry.services.versions import version_register, version_transition
    from serving import tasks
    from serving.discovery.kubernetes import EndpointSliceWatch, WatchTarget, api_client
    from serving.models import Replica
    from serving.reconcile.tick import reconcile_deployment
    from serving.rollouts.engine import rollout_execute
    from serving.services.deployments import deployment_create
    from serving.services.promotions import promotion_create
    from tests.support.adapters import AdapterSpec, adapter_tar_gz
    from tests.support.k8s_apiserver import StandInKubeAPIServer
    from tests.support.vllm_standin import serve_standin

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    route_to_queue(app, queue)
    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    admin = Actor(user=users.create_user("admin", is_staff=True, is_superuser=True))
    member, approver = users.create_user("member"), users.create_user("approver")
    legal = Department.objects.create(slug="legal", name="Legal")
    Membership.objects.create(user=member, department=legal, role=Role.MEMBER)
    Membership.objects.create(user=approver, department=legal, role=Role.APPROVER)
    deployment = deployment_create(
        actor=admin,
        name="bench",
        base_model_name="tiny-llama",
        kubernetes_namespace="ml",
        kubernetes_label_selector="app=bench",
        kubernetes_service_name="bench",
        volume_write_path=str(var_dir / "volume"),
        volume_serve_path=str(var_dir / "volume"),
        architecture="LlamaForCausalLM",
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=512,
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=16,
    )
    adapter = adapter_create(
        actor=Actor(user=member),
        department=legal,
        name="contracts",
        base_model="tiny-llama",
        served_name="legal-contracts",
    )
    upload = SimpleUploadedFile("a.tar.gz", adapter_tar_gz(AdapterSpec(seed=1)))
    version = version_register(
        actor=Actor(user=member), adapter=adapter, source=UploadedFiles([upload])
    ).version
    version_transition(actor=Actor(user=member), version=version, action="submit")
    version = version_transition(actor=Actor(user=approver), version=version, action="approve")

    server = StandInKubeAPIServer(bookmark_seconds=5)
    settings.KUBERNETES_AUTH = "kubeconfig"
    settings.KUBERNETES_KUBECONFIG = str(server.write_kubeconfig(var_dir / "kubeconfig"))
    seed = serve_standin()
    port_of = {}

    def add_pod(name: str, fake) -> None:
        port_of[name] = int(fake.base_url.rsplit(":", 1)[1])
        server.apply_slice(
            "ml",
            name,
            labels={
                "app": "bench",
                "kubernetes.io/service-name": "bench",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            endpoints=[("127.0.0.1", True)],
            port=port_of[name],
        )

    mode = {"value": "watch"}

    reconciles: list[threading.Thread] = []

    def enqueue(deployment_id: int) -> None:
        if mode["value"] == "watch":
            thread = threading.Thread(
                target=reconcile_deployment, args=(deployment_id, "bench-worker")
            )
            reconciles.append(thread)
            thread.start()

    tasks.reconcile_one.delay = enqueue
    watch = EndpointSliceWatch(WatchTarget.of(deployment), api_client())
    runner = threading.Thread(target=watch.run, daemon=True)
    runner.start()
    add_pod("seed", seed)
    _wait(lambda: Replica.objects.filter(deployment=deployment, active=True).exists())
    promotion = promotion_create(actor=Actor(user=member), deployment=deployment, version=version)
    assert rollout_execute(promotion.rollouts.get().pk, "bench") == "succeeded"
    _wait(lambda: "legal-contracts" in seed.adapters)

    results: dict[str, list[float]] = {"watch": [], "beat": [], "direct": []}

    def one_round(case: str, round_number: int) -> None:
        # The last round's pod removal enqueued a reconcile too: one still
        # running holds the deployment, and the next would skip it.
        while reconciles:
            reconciles.pop().join()
        mode["value"] = case
        pod = serve_standin()
        name = f"pod-{case}-{round_number}"
        if case == "beat":  # a random phase of the beat's period
            time.sleep(random.uniform(0, options.interval))
        started = time.monotonic()
        add_pod(name, pod)
        if case == "direct":
            _wait(lambda: Replica.objects.filter(base_url=pod.base_url, active=True).exists())
            started = time.monotonic()
            reconcile_deployment(deployment.pk, "bench-direct")
        _wait(lambda: "legal-contracts" in pod.adapters, timeout=options.interval * 3 + 30)
        results[case].append(time.monotonic() - started)
        server.delete_slice("ml", name)
        _wait(lambda: not Replica.objects.filter(base_url=pod.base_url, active=True).exists())
        pod.close()

    for round_number in range(options.rounds):
        for case in ("watch", "direct"):
            one_round(case, round_number)

    # The baseline: the product's beat and a worker, real processes, running
    # only now (so no tick of theirs ever helped the watch).
    log_dir = var_dir / "log"
    log_dir.mkdir(exist_ok=True)
    mode["value"] = "beat"
    worker = start_worker(queue, log_dir / "worker.log", concurrency=1)
    beat_process = None
    try:
        wait_worker_ready(log_dir / "worker.log")
        beat_process = start_beat(queue, log_dir / "beat.log", var_dir / "beat-schedule")
        wait_beat_ticking(log_dir / "beat.log")
        for round_number in range(options.rounds):
            try:
                one_round("beat", round_number)
            except RuntimeError:
                alive = beat_process.poll() is None and worker.poll() is None
                beat_log = (log_dir / "beat.log").read_text(errors="replace").splitlines()
                raise RuntimeError(
                    f"the beat baseline timed out (beat and worker alive: {alive}); "
                    f"see {log_dir}; the beat's last lines:\n" + "\n".join(beat_log[-5:])
                ) from None
    finally:
        if beat_process is not None:
            stop_process(beat_process)
        stop_process(worker)

    watch.stop()
    server.close()
    seed.close()

    out = bench_results.Results("new_pod_to_served", options)
    heading = f"new pod ready -> adapter loaded on it, {options.rounds} rounds, ms"
    print(heading)
    out.note(heading + "; replicas: the vLLM stand-in (latency model: zero, in every case)")
    table = out.table("cases", ["case", "median ms", "p95 ms", "max ms"], heading)
    print(f"{'case':<8}{'median':>10}{'p95':>10}{'max':>10}")
    for case, label in (
        ("watch", "watch (product)"),
        ("beat", f"beat every {options.interval:g} s (baseline: celery beat + worker)"),
        ("direct", "direct (the reconcile alone)"),
    ):
        values = sorted(v * 1000 for v in results[case])
        p95 = values[min(len(values) - 1, int(round(0.95 * len(values) + 0.4999)) - 1)]
        print(f"{case:<8}{statistics.median(values):>10.1f}{p95:>10.1f}{values[-1]:>10.1f}")
        table.row(label, statistics.median(values), p95, values[-1])
    watch_median = statistics.median(results["watch"])
    beat_median = statistics.median(results["beat"])
    summary = (
        f"watch is {beat_median / watch_median:.0f}x faster than the beat "
        f"(interval {options.interval:g} s) at the median"
    )
    print(summary)
    out.note(summary)
    out.headline(
        "new pod ready → serves its adapters",
        f"{watch_median * 1000:.0f} ms median",
        f"a real celery beat every {options.interval:g} s: {beat_median:.1f} s",
    )
    out.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
