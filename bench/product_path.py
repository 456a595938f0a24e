"""What the benchmarks that drive the product's promotion path share: the
environment, a cast and token made through the services, a `celery worker`
subprocess on the bench's own queue, the bare sequence a person would run by
hand, and reading a rollout's own records to say where its time went.

Used by bench/promote_to_served.py (real vLLM, one promotion at a time) and
bench/scale_promotions.py (the stand-in, 100 at once).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parents[1]


def configure_env(var_dir: Path, broker: str | None) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["VAR_DIR"] = str(var_dir)
    os.environ.setdefault("DJANGO_DEBUG", "true")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-secret-key")
    os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver,localhost,127.0.0.1"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.pop("CELERY_TASK_ALWAYS_EAGER", None)
    if broker:
        os.environ["CELERY_BROKER_URL"] = broker
    from bench.results import seed_sqlite

    seed_sqlite(var_dir)


class ThrowawayPostgres:
    """A fresh database beside the one DATABASE_URL names, dropped afterwards, so
    a run neither meets the last run's rows nor leaves its own (the cast has
    fixed names)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        # CREATE/DROP DATABASE run from the maintenance database (the named one may not exist).
        self.admin_url = urlunsplit(parts._replace(path="/postgres"))
        self.name = f"{parts.path.lstrip('/') or 'postgres'}_bench_{uuid.uuid4().hex[:8]}"
        self.url = urlunsplit(parts._replace(path="/" + self.name))

    def __enter__(self) -> str:
        self._execute(f'CREATE DATABASE "{self.name}"')
        os.environ["DATABASE_URL"] = self.url
        return self.url

    def __exit__(self, *exc) -> None:
        from django.db import connections

        connections.close_all()
        self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(sql)


# -- statistics ------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, int(round(q / 100 * len(ordered) + 0.4999)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Series:
    label: str
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p95(self) -> float:
        return percentile(self.seconds, 95)


# -- the bare sequence ---------------------------------------------------------------


def bare_on_replica(session, url: str, name: str, folder: Path, base_name: str = "") -> None:
    """`POST /v1/load_lora_adapter`, then one completion through the adapter.
    Given `base_name`, the completion is the product's own verification instead
    (serving/replica_calls.verify_serving): `/v1/models` lists the adapter at its
    folder, and the fingerprint probe through it differs from the same probe
    through the base model; so a baseline that verifies does what the product
    does, and the ratio measures the control plane."""
    loaded = session.post(
        url + "/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(folder)},
        timeout=60,
    )
    if loaded.status_code != 200:
        raise RuntimeError(f"bare load on {url}: {loaded.status_code} {loaded.text[:300]}")
    if base_name:
        bare_verify(session, url, name, folder, base_name)
        return
    answer = session.post(
        url + "/v1/completions",
        json={"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
        timeout=30,
    )
    if answer.status_code != 200:
        raise RuntimeError(f"bare completion on {url}: {answer.status_code}")


def bare_verify(session, url: str, name: str, folder: Path, base_name: str) -> None:
    from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe, has_no_effect

    cards = session.get(url + "/v1/models", timeout=30).json()["data"]
    if not any(c["id"] == name and c.get("root") == str(folder) for c in cards):
        raise RuntimeError(f"bare verify on {url}: {name} is not listed at {folder}")

    def probe(model: str) -> Probe:
        answer = session.post(
            url + "/v1/completions",
            json={
                "model": model,
                "prompt": PROBE_PROMPT,
                "max_tokens": PROBE_TOKENS,
                "temperature": 0,
                "logprobs": 1,
            },
            timeout=30,
        )
        found = Probe.from_body(answer.json()) if answer.status_code == 200 else None
        if found is None:
            raise RuntimeError(f"bare probe of {model} on {url}: {answer.status_code}")
        return found

    if has_no_effect(probe(name), probe(base_name)):
        raise RuntimeError(f"bare verify on {url}: {name} answers like the base model")


def bare_copy(source: Path, volume: Path, name: str) -> Path:
    folder = volume / "bare" / name
    shutil.copytree(source, folder)
    return folder


def bare_cleanup(name: str, urls: list[str], sessions) -> None:
    for session, url in zip(sessions, urls, strict=True):
        session.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)


# -- the product -----------------------------------------------------------------------


class Cast:
    """Users, a department and a token, all made through the services."""

    def __init__(self) -> None:
        from django.contrib.auth import get_user_model

        from core.actors import Actor
        from core.models import Ability, Department, Membership, Role
        from core.services.tokens import token_create

        User = get_user_model()
        self.admin = User.objects.create_user("bench-admin", is_staff=True, is_superuser=True)
        self.member = User.objects.create_user("bench-member")
        self.approver = User.objects.create_user("bench-approver")
        self.department = Department.objects.create(slug="bench", name="Bench")
        Membership.objects.create(user=self.member, department=self.department, role=Role.MEMBER)
        Membership.objects.create(
            user=self.approver, department=self.department, role=Role.APPROVER
        )
        _, self.secret = token_create(
            actor=Actor(user=self.member, request_id="bench"),
            department=self.department,
            name="bench",
            abilities=list(Ability.values),
        )
        self.client = self.api_client()

    def api_client(self):
        """An in-process API client holding the token (one per thread)."""
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.secret}")
        return client

    def deployment(self, name: str, urls: list[str], volume: Path, model_dir: Path, **options):
        from core.actors import Actor
        from serving.services.deployments import deployment_create

        return deployment_create(
            actor=Actor(user=self.admin, request_id="bench"),
            name=name,
            environment="bench",
            base_model_name="tiny-llama",
            base_model_path=str(model_dir),
            replica_urls=urls,
            volume_write_path=str(volume),
            volume_serve_path=str(volume),
            max_lora_rank=16,
            **options,
        )

    def approved_version(self, name: str, files_dir: Path):
        from django.core.files.uploadedfile import SimpleUploadedFile

        from core.actors import Actor
        from registry.ingest.incoming import UploadedFiles
        from registry.services.adapters import adapter_create
        from registry.services.versions import version_register, version_transition

        member = Actor(user=self.member, request_id="bench")
        approver = Actor(user=self.approver, request_id="bench")
        adapter = adapter_create(
            actor=member,
            department=self.department,
            name=name,
            base_model="tiny-llama",
            served_name=name,
        )
        uploads = [
            SimpleUploadedFile(p.name, p.read_bytes(), content_type="application/octet-stream")
            for p in sorted(files_dir.iterdir())
        ]
        version = version_register(
            actor=member, adapter=adapter, source=UploadedFiles(uploads)
        ).version
        version_transition(actor=member, version=version, action="submit")
        return version_transition(actor=approver, version=version, action="approve")

    def promote(self, deployment: str, version, client=None) -> tuple[float, float, int]:
        """POST the promotion; returns (t_before, t_returned, rollout id)."""
        t_before = time.perf_counter()
        response = (client or self.client).post(
            "/api/v1/promotions/",
            {"deployment": deployment, "version": version.pk},
            format="json",
        )
        t_returned = time.perf_counter()
        if response.status_code != 201:
            raise RuntimeError(f"promotion: {response.status_code} {response.content[:500]!r}")
        return t_before, t_returned, response.json()["rollout"]

    def retire(self, deployment, version) -> int:
        """Starts the retire rollout; returns its id (wait_rollout waits for it)."""
        from core.actors import Actor
        from serving.services.promotions import retire

        rollout = retire(
            actor=Actor(user=self.member, request_id="bench"),
            deployment=deployment,
            adapter=version.adapter,
        )
        return rollout.pk


def wait_rollout(rollout_id: int, timeout: float = 120):
    from serving.models import Rollout
    from serving.rules.transitions import ROLLOUT_TERMINAL

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rollout = Rollout.objects.get(pk=rollout_id)
        if rollout.status in ROLLOUT_TERMINAL:
            return rollout
        time.sleep(0.02)
    raise TimeoutError(f"rollout {rollout_id} still {rollout.status}")


def breakdown(rollout, reference_wall: float) -> dict[str, float]:
    """Where the rollout's time went, from its own records (seconds).
    `reference_wall`: when the promotion API returned (time.time())."""
    attempts = sorted(
        (a for step in rollout.replica_steps.all() for a in step.attempts.all()),
        key=lambda a: a.started_at,
    )
    started = rollout.started_at.timestamp()
    finished = rollout.finished_at.timestamp()
    first = attempts[0].started_at.timestamp()
    loads = [a for a in attempts if a.purpose in ("version", "list_models", "load")]
    verifies = [a for a in attempts if a.purpose.startswith("verify")]
    load_end = max(a.started_at.timestamp() + a.duration_ms / 1000 for a in loads)
    verify_start = min(a.started_at.timestamp() for a in verifies)
    verify_end = max(a.started_at.timestamp() + a.duration_ms / 1000 for a in verifies)
    return {
        "pickup": started - reference_wall,
        "stage": first - started,
        "load": load_end - first,
        "between": verify_start - load_end,
        "verify": verify_end - verify_start,
        "record": finished - verify_end,
        "total": finished - reference_wall,
        "attempts": len(attempts),
    }


# -- the worker --------------------------------------------------------------------------

# Every task goes to the bench's own queue (a shared Redis may have other
# consumers of the product's queues), in the worker too: a task that retries (a
# retire that finds the claim still held for a moment) is re-sent from the worker.
_WORKER = """
import sys
from config.celery import app
app.conf.task_default_queue = sys.argv[1]
app.conf.task_routes = {"*": {"queue": sys.argv[1]}}
app.worker_main(["worker", "-Q", sys.argv[1], "-n", sys.argv[1] + "@%h",
                 "--concurrency=" + sys.argv[2], "--loglevel=INFO"])
"""


# The product's `celery beat`, its every task sent to the bench's queue.
_BEAT = """
import sys
from config.celery import app
app.conf.task_default_queue = sys.argv[1]
app.conf.task_routes = {"*": {"queue": sys.argv[1]}}
app.start(["beat", "--schedule", sys.argv[2], "--loglevel=INFO"])
"""


def start_beat(queue: str, log: Path, schedule_file: Path) -> subprocess.Popen:
    """A real `celery beat` process with the product's CELERY_BEAT_SCHEDULE
    (intervals from the environment, e.g. SERVING_RECONCILE_INTERVAL_SECONDS)."""
    handle = open(log, "ab")  # noqa: SIM115 - lives as long as the beat
    return subprocess.Popen(
        [sys.executable, "-c", _BEAT, queue, str(schedule_file)],
        cwd=REPO_ROOT,
        env=dict(os.environ),
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def wait_beat_ticking(log: Path, timeout: float = 90) -> None:
    """Until the beat has sent its first task: its start-up (Django, the schedule
    file) is not part of any period a pod may appear in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "Sending due task" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"celery beat sent nothing; see {log}")


def route_to_queue(app, queue: str) -> None:
    app.conf.task_default_queue = queue
    app.conf.task_routes = {"*": {"queue": queue}}


def start_worker(queue: str, log: Path, concurrency: int = 2) -> subprocess.Popen:
    """A `celery worker` process (prefork, `concurrency` children, as the
    documented worker commands start it)."""
    handle = open(log, "ab")  # noqa: SIM115 - lives as long as the worker
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, queue, str(concurrency)],
        cwd=REPO_ROOT,
        env=dict(os.environ),
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def wait_worker_ready(log: Path, timeout: float = 180) -> None:
    # Generous: in the suite a bench smoke may start its worker while the other
    # heavy worker boots vLLM servers on the same two cores (a 60 s wait ran out).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "ready." in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"celery worker not ready; see {log}")


def stop_process(process: subprocess.Popen, timeout: float = 20) -> None:
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
