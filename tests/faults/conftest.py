"""The fault tier: the control plane as it runs in production, broken on purpose.

Real parts only: the suite's PostgreSQL database, shared with Celery worker
and beat SUBPROCESSES (so a SIGKILL is a real SIGKILL, and their connections
carry an application_name of their own, so they alone can be terminated), a
redis-server of this tier's own (a restart never touches CI's), the moto S3
server behind a TCP proxy that can leave the network, a real MLflow server,
and a pair of real vLLM servers shared by the tier (at most two run at once on
this machine), one of them behind tests/support/fault_proxy.py.

Each scenario measures how long the system takes to converge after the fault
ends, the rows left in a non-terminal state (claims still held included), and
the audit events missing (its own count, and `manage.py audit_verify` on the
hash chain), and asserts all three. The figures land in $FAULT_FIGURES_JSON
(default test-artifacts/faults.json; docs/faults.md gives the shape), from
which `make figures` renders the "faults" block of docs/figures.md.
"""

from __future__ import annotations

import json
import os
import platform as host_platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.db import connection, connections

from core.claims import Lease
from scripts.figures import fault_rows
from tests.serving.vllm.conftest import Platform, api_for
from tests.support.fault_proxy import FaultProxy
from tests.support.processes import CeleryBeat, CeleryWorker, RedisServer, TcpProxy
from tests.support.vllm_servers import (
    DEFAULT_MODEL_DIR,
    VLLMServer,
    vllm_available,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
WORKER_APP_NAME = "faults-worker"
MIRROR_MODELS = {"MlflowVersionMirror", "MlflowAliasMirror"}

# Settings for the worker and beat subprocesses: short claims and ticks, so a
# crashed worker's work is free again in seconds and the tier stays short.
# Names a given branch does not know are simply ignored by it.
FAST = {
    "SERVING_RETRY_DEADLINE_SECONDS": "120",
    "SERVING_RETRY_BASE_SECONDS": "0.2",
    "SERVING_RETRY_MAX_DELAY_SECONDS": "1",
    "SERVING_HTTP_TIMEOUT_SECONDS": "60",
    "SERVING_CONNECT_TIMEOUT_SECONDS": "3",
    "SERVING_LEASE_SECONDS": "10",
    "SERVING_CLAIM_SECONDS": "6",
    "SERVING_SWEEP_INTERVAL_SECONDS": "2",
    "SERVING_SWEEP_AFTER_SECONDS": "3",
    "SERVING_RECONCILE_INTERVAL_SECONDS": "2",
    "MLFLOW_MIRROR_CATCH_UP_SECONDS": "10",
    "MLFLOW_MIRROR_BACKOFF_SECONDS": "0",
    "MLFLOW_MIRROR_MAX_RETRIES": "0",
    "MLFLOW_HTTP_MAX_RETRIES": "0",
    "MLFLOW_HTTP_TIMEOUT": "5",
    "CELERY_BROKER_POLL_SECONDS": "0.05",
    # A webhook delivery's bound; its claim is 3x this + 30 s (a killed worker's
    # delivery is free again after 39 s, not 60).
    "NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS": "3",
    "LOG_LEVEL": "INFO",
}


def _longest_claim_seconds() -> float:
    from mlflow_bridge.mirror import CLAIM_SECONDS as MIRROR_CLAIM_SECONDS

    return max(float(FAST["SERVING_CLAIM_SECONDS"]), float(MIRROR_CLAIM_SECONDS))


# Longer than any claim the tier's processes take, so a dead holder's claim has
# expired by the time settle() gives up waiting for claims to go (it waits only
# while one is held).
CLAIM_WAIT_SECONDS = _longest_claim_seconds() + 5


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.faults)


# -- what every scenario needs first ----------------------------------------------------


@pytest.fixture(scope="package")
def fault_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="package", autouse=True)
def fault_tier_prerequisites():
    """Checked before any server of the tier starts (package fixtures come first)."""
    if connection.vendor != "postgresql":
        pytest.skip(
            "the fault tier needs PostgreSQL: worker subprocesses share the test "
            "database, and scenario 3 terminates their connections (DATABASE_URL=postgres://…)"
        )
    if not shutil.which("redis-server"):
        pytest.skip("the fault tier starts a redis-server of its own: apt-get install redis-server")


@pytest.fixture(scope="package")
def fault_redis(fault_dir) -> Iterator[RedisServer]:
    """The tier's own Redis: restarting it never touches a shared one."""
    server = RedisServer(fault_dir / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def replicas(request) -> list[VLLMServer]:
    """Two real replicas, up and without runtime adapters: the session's shared
    pair (tests/support/vllm_pool.py), which starts again one a scenario before
    killed or stopped, continues one it froze, and unloads what it left loaded."""
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/vllm/install.sh; scripts/test.sh does)")
    return request.getfixturevalue("vllm_pool").servers(2)


@pytest.fixture
def proxy_b(replicas) -> Iterator[FaultProxy]:
    """Replica B as the control plane sees it: through the fault proxy."""
    proxy = FaultProxy(replicas[1].base_url)
    try:
        yield proxy
    finally:
        proxy.close()


def adapters_listed(server_or_url) -> dict[str, str | None]:
    import requests

    base = server_or_url if isinstance(server_or_url, str) else server_or_url.base_url
    cards = requests.get(base + "/v1/models", timeout=30).json()["data"]
    return {c["id"]: c.get("root") for c in cards if c.get("parent")}


def answers(base_url: str, model: str) -> bool:
    """A one-token completion through `model` answers 200 (the product's promise)."""
    import requests

    try:
        response = requests.post(
            base_url + "/v1/completions",
            json={"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
            timeout=30,
        )
    except requests.RequestException:
        return False
    return response.status_code == 200


@pytest.fixture
def s3_behind_proxy(settings, s3_endpoint, request) -> Iterator[tuple[TcpProxy, str]]:
    """This test's artifact store: a fresh bucket on the real S3 server, reached
    through a TCP proxy that can take S3 off the network. Yields (proxy, bucket)."""
    from urllib.parse import urlsplit

    from registry.artifact_store import get_artifact_store
    from tests.support.s3_server import make_bucket

    bucket = f"faults-{abs(hash(request.node.nodeid)) % 10**10}"
    make_bucket(s3_endpoint, bucket)
    moto = urlsplit(s3_endpoint)
    proxy = TcpProxy(moto.hostname, moto.port)
    settings.ARTIFACT_STORE_URL = f"s3://{bucket}/registry"
    settings.ARTIFACT_S3 = {
        **settings.ARTIFACT_S3,
        "endpoint_url": proxy.url,
        "access_key": "testing",
        "secret_key": "testing",
        "addressing_style": "path",
        "region": "us-east-1",
    }
    get_artifact_store.cache_clear()
    try:
        yield proxy, bucket
    finally:
        proxy.close()
        get_artifact_store.cache_clear()


@pytest.fixture(scope="package")
def fault_mlflow(fault_dir) -> Iterator[Any]:
    from tests.support.mlflow_server import MlflowServer, mlflow_venv, server_installed

    if not server_installed():
        message = f"no MLflow server in {mlflow_venv()}: run `bash scripts/mlflow/install.sh`"
        if os.environ.get("REQUIRE_MLFLOW"):
            pytest.fail(message + "; REQUIRE_MLFLOW is set", pytrace=False)
        pytest.skip(message)
    server = MlflowServer.from_repo(fault_dir / "mlflow")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_up(settings, fault_mlflow):
    """MLflow on, in this process and in the workers this test starts."""
    if not fault_mlflow.running:
        fault_mlflow.start()
    settings.MLFLOW_TRACKING_URI = fault_mlflow.url
    settings.MLFLOW_UI_URL = fault_mlflow.url
    settings.MLFLOW_MIRROR_ENABLED = True
    settings.MLFLOW_HTTP_TIMEOUT = 5
    settings.MLFLOW_HTTP_MAX_RETRIES = 0
    return fault_mlflow


# -- the product's processes, on the test database ------------------------------------------


def worker_database_url() -> str:
    db = connection.settings_dict
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    auth = f"{quote(db['USER'] or '', safe='')}{password}@" if db.get("USER") else ""
    host = f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"
    return f"postgres://{auth}{host}/{db['NAME']}?application_name={WORKER_APP_NAME}"


def _subprocess_env(var_dir: Path, broker: str | None, settings, extra: dict) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "AWS_", "SERVING_", "CELERY_"))
        and k not in ("ARTIFACT_STORE_URL", "DATABASE_URL", "PYTEST_CURRENT_TEST")
    }
    env.update(FAST)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": worker_database_url(),
            "VAR_DIR": str(var_dir),
            "ARTIFACT_STORE_URL": settings.ARTIFACT_STORE_URL,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if broker:
        env["CELERY_BROKER_URL"] = broker
    s3 = settings.ARTIFACT_S3
    if settings.ARTIFACT_STORE_URL.startswith("s3://"):
        env.update(
            {
                "AWS_ENDPOINT_URL": s3["endpoint_url"],
                "AWS_ACCESS_KEY_ID": s3["access_key"],
                "AWS_SECRET_ACCESS_KEY": s3["secret_key"],
                "AWS_REGION": s3["region"],
                "AWS_S3_ADDRESSING_STYLE": s3["addressing_style"],
            }
        )
    if settings.MLFLOW_TRACKING_URI:
        env["MLFLOW_TRACKING_URI"] = settings.MLFLOW_TRACKING_URI
    env.update(extra)
    return env


def _probe_broker(env: dict[str, str]) -> tuple[str, dict]:
    """The broker URL and transport options the product's settings give for `env`
    (the embedded default when CELERY_BROKER_URL is unset), read the way the
    worker will read them."""
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_URL, "
        "getattr(s, 'CELERY_BROKER_TRANSPORT_OPTIONS', None) or {}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    url, options = json.loads(out.stdout.strip().splitlines()[-1])
    return url, options


# Celery reads these from the environment BEFORE its configuration
# (celery.app.utils.Settings.broker_url): with CELERY_BROKER_URL set, as
# .ci/run sets it, app.conf.broker_url = ... is silently ignored and this
# process would publish to CI's Redis while the workers listen on the tier's.
BROKER_ENV = ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL")


def _point_app_at(app, url: str, options: dict, environ: dict[str, str | None]) -> None:
    """Makes this process publish to `url` (the promotions the test makes go
    through the product's on-commit enqueue, to the same broker as the worker).
    `environ` gives the broker variables to set (None: unset)."""
    import kombu.pools

    for name in BROKER_ENV:
        value = environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # Connection and producer pools are cached per broker URL, here and in kombu.
    kombu.pools.reset()
    app.conf.broker_url = url
    app.conf.broker_read_url = None
    app.conf.broker_write_url = None
    app.conf.broker_transport_options = options
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
    with app.connection_for_write() as publishing:
        # Where this process publishes is where the workers consume, or no
        # scenario means anything.
        assert publishing.as_uri() == app.connection_for_write(url).as_uri(), (
            f"this process publishes to {publishing.as_uri()}, the workers read {url}"
        )


@dataclass
class Stack:
    """The product's background processes for one scenario."""

    settings: Any
    base_dir: Path
    redis: RedisServer
    broker_kind: str = "redis"
    broker_url: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: list[CeleryWorker] = field(default_factory=list)
    beats: list[CeleryBeat] = field(default_factory=list)
    _saved_app: tuple | None = None

    def env(self, **extra: str) -> dict[str, str]:
        broker = self.redis.url(0) if self.broker_kind == "redis" else None
        return _subprocess_env(self.base_dir / "var", broker, self.settings, self.extra_env | extra)

    def use_broker(self, kind: str) -> None:
        """`redis` (the tier's own) or `embedded` (the product's no-server default)."""
        from config.celery import app

        self.broker_kind = kind
        (self.base_dir / "var").mkdir(parents=True, exist_ok=True)
        if kind == "redis":
            self.redis.start()
            self.redis_flush()
            url, options = self.redis.url(0), {}
        else:
            url, options = _probe_broker(self.env())
        if self._saved_app is None:
            self._saved_app = (
                app.conf.broker_url,
                app.conf.broker_transport_options,
                {name: os.environ.get(name) for name in BROKER_ENV},
            )
        _point_app_at(app, url, options, {"CELERY_BROKER_URL": url})
        self.broker_url = url

    def redis_flush(self) -> None:
        import redis

        redis.Redis(port=self.redis.port).flushall()

    def start_worker(self, name: str = "worker", *, wait: bool = True, **kw) -> CeleryWorker:
        index = len(self.workers)
        worker = CeleryWorker(
            self.env(), self.base_dir / f"{name}-{index}.log", name=f"{name}{index}", **kw
        )
        worker.start()
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def start_beat(self, name: str = "beat") -> CeleryBeat:
        index = len(self.beats)
        beat = CeleryBeat(
            self.env(),
            self.base_dir / f"{name}-{index}.log",
            self.base_dir / f"{name}-{index}-schedule",
        )
        beat.start().wait_ready()
        self.beats.append(beat)
        return beat

    def close(self) -> None:
        from config.celery import app

        for process in [*self.beats, *self.workers]:
            process.kill()
        if self._saved_app is not None:
            _point_app_at(app, *self._saved_app)


@pytest.fixture
def stack(transactional_db, settings, fault_redis, tmp_path, request) -> Iterator[Stack]:
    settings.CELERY_TASK_ALWAYS_EAGER = False
    built = Stack(settings=settings, base_dir=tmp_path / "stack", redis=fault_redis)
    built.base_dir.mkdir()
    try:
        yield built
    finally:
        built.close()
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            for process in [*built.workers, *built.beats]:
                print(f"\n--- {process.log_path.name} ---\n{process.log_tail(4000)}")
        # The workers' connections are gone with them; ours must not hold the
        # flush that follows.
        connections.close_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def platform(root, lena, alex, tmp_path) -> Platform:
    return Platform(
        admin=api_for(root),
        member=api_for(lena),
        approver=api_for(alex),
        volume=tmp_path / "volume",
        # Where the shared pool generates it; a scenario without replicas installs nothing.
        tiny_model=DEFAULT_MODEL_DIR.resolve(),
    )


# -- what "converged" means -----------------------------------------------------------------


def stuck_rows() -> list[str]:
    """Rows left in a non-terminal state once the scenario is over: rollouts,
    their replica steps, approved promotions that never got a rollout, MLflow
    mirror rows. Claims are counted by claims_left (they need a wait)."""
    from serving.models import Promotion, PromotionStatus, ReplicaRollout, Rollout
    from serving.rules.transitions import ROLLOUT_TERMINAL

    stuck = [
        f"rollout {pk} {status}"
        for pk, status in Rollout.objects.exclude(status__in=ROLLOUT_TERMINAL).values_list(
            "pk", "status"
        )
    ]
    stuck += [
        f"replica step {pk} {status} of finished rollout {rollout}"
        for pk, status, rollout in ReplicaRollout.objects.filter(
            rollout__status__in=ROLLOUT_TERMINAL, status__in=["pending", "loading", "verifying"]
        ).values_list("pk", "status", "rollout_id")
    ]
    stuck += [
        f"promotion {pk} approved without a rollout"
        for pk in Promotion.objects.filter(
            status=PromotionStatus.APPROVED, rollouts__isnull=True
        ).values_list("pk", flat=True)
    ]
    # Found by name: the MLflow mirror is moving to an app of its own.
    mirrors = [m for m in apps.get_models() if m.__name__ in MIRROR_MODELS]
    for model in mirrors:
        stuck += [
            f"{model.__name__} {pk} {state}"
            for pk, state in model.objects.exclude(state__in=["synced", "failed"]).values_list(
                "pk", "state"
            )
        ]
    return stuck


def held_claims() -> list[str]:
    """Claims (core.claims leases) held right now: the owner set and not expired.
    An expired claim is free by design (its holder died; the next claimer takes it)."""
    from django.utils import timezone

    from serving.records.leases import RECONCILE_LEASE, SERVED_ADAPTER_LEASE

    now = timezone.now()
    leases = [SERVED_ADAPTER_LEASE, RECONCILE_LEASE]
    mirrors = [m for m in apps.get_models() if m.__name__ in MIRROR_MODELS]
    leases += [Lease(model, "claimed_by", "claimed_until") for model in mirrors]
    held = []
    for lease in leases:
        rows = lease.model.objects.exclude(lease.free(now)).exclude(**{lease.owner_field: ""})
        held += [
            f"{lease.model.__name__} {pk} claimed by {owner!r} until {until:%H:%M:%S}"
            for pk, owner, until in rows.values_list("pk", lease.owner_field, lease.until_field)
        ]
    return held


def claims_left(timeout: float) -> list[str]:
    """Claims still held after `timeout`: a converged system holds a claim only
    for the moment a reconcile tick or a task works, so there is an instant
    with none; a claim that never lets go (or is renewed by nobody's work) is
    stuck. `timeout` is at least a claim's length, so a dead holder's claim
    has expired by then."""
    deadline = time.monotonic() + timeout
    while True:
        held = held_claims()
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def audit_chain() -> tuple[bool, list[str]]:
    """`manage.py audit_verify` on the audit log: (chain ok, what it found)."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    try:
        call_command("audit_verify", stdout=out)
    except CommandError as error:
        return False, [f"audit chain: {error}"]
    return True, []


def lost_rollout_audit() -> list[str]:
    """Every rollout has exactly one audit event for its start and one for its end."""
    from core.models import AuditEvent
    from serving.models import Rollout
    from serving.rules.transitions import ROLLOUT_TERMINAL

    problems = []
    for rollout in Rollout.objects.all():
        events = list(
            AuditEvent.objects.filter(
                object_type="serving.rollout", object_id=str(rollout.pk)
            ).values_list("action", flat=True)
        )
        expected = [f"rollout.{rollout.kind}"]
        if rollout.status in ROLLOUT_TERMINAL:
            expected.append(f"rollout.{rollout.status}")
        for action in expected:
            count = events.count(action)
            if count == 0:
                problems.append(f"rollout {rollout.pk}: no {action}")
            elif count > 1:
                problems.append(f"rollout {rollout.pk}: {action} recorded {count} times")
    return problems


def wait_for(condition: Callable[[], Any], timeout: float, interval: float = 0.2) -> float | None:
    """Seconds until `condition()` was truthy, or None if it never was."""
    started = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - started
        except Exception:  # noqa: BLE001 - a fault in progress may make the probe fail
            connections.close_all()
        if time.monotonic() - started > timeout:
            return None
        time.sleep(interval)


# -- figures ------------------------------------------------------------------------------

_figures: dict[str, dict] = {}


@dataclass
class Measure:
    """One scenario's three figures, recorded even when the scenario fails."""

    scenario: str
    limit_seconds: float
    converged_seconds: float | None = None
    stuck: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    recovered_at: float | None = None

    def fault_ended(self) -> None:
        """The clock for "converged after the fault" starts now."""
        self.recovered_at = time.monotonic()

    settled: bool = False

    def converge(
        self, condition: Callable[[], Any], timeout: float | None = None, interval: float = 0.2
    ) -> float | None:
        """Waits for `condition`; the figure counts from fault_ended() (or from now)."""
        start = self.recovered_at or time.monotonic()
        limit = (timeout or self.limit_seconds) - (time.monotonic() - start)
        waited = wait_for(condition, max(limit, 0.0), interval)
        self.converged_seconds = None if waited is None else time.monotonic() - start
        return self.converged_seconds

    chain_ok: bool | None = None

    def settle(self, lost: list[str] | None = None) -> None:
        """Counts what the fault left behind: rows stuck (claims included) and
        audit events lost: the scenario's own count (`lost`; by default each
        rollout's start and end event) plus the hash chain's check, so a
        missing, changed or reordered event anywhere counts too."""
        self.settled = True
        self.stuck = stuck_rows() + claims_left(CLAIM_WAIT_SECONDS)
        self.chain_ok, broken = audit_chain()
        self.lost = (lost_rollout_audit() if lost is None else lost) + broken

    def check(self) -> None:
        assert self.converged_seconds is not None, (
            f"{self.scenario}: did not converge within {self.limit_seconds:.0f}s after the fault"
        )
        assert self.stuck == [], self.stuck
        assert self.lost == [], self.lost


@pytest.fixture
def measure(request) -> Iterator[Callable[..., Measure]]:
    made: list[Measure] = []

    def start(scenario: str, limit_seconds: float) -> Measure:
        made.append(Measure(scenario, limit_seconds))
        return made[-1]

    started = time.monotonic()
    yield start
    for m in made:
        if not m.settled:  # the scenario failed before it got there: count now
            try:
                m.settle()
            except Exception as error:  # noqa: BLE001 - figures must not hide the failure
                m.stuck = [f"could not count: {error}"]
        _figures[m.scenario] = {
            "scenario": m.scenario,
            "test": request.node.nodeid,
            "limit_seconds": m.limit_seconds,
            "converged_seconds": (
                None if m.converged_seconds is None else round(m.converged_seconds, 2)
            ),
            "rows_stuck": len(m.stuck),
            "audit_events_lost": len(m.lost),
            "chain_ok": m.chain_ok,
            "stuck": m.stuck,
            "lost": m.lost,
            "test_seconds": round(time.monotonic() - started, 1),
            **m.notes,
        }


def figures_path() -> Path:
    """Where the tier writes its figures (docs/faults.md gives the shape):
    $FAULT_FIGURES_JSON, else test-artifacts/faults.json."""
    return Path(os.environ.get("FAULT_FIGURES_JSON") or ARTIFACTS / "faults.json")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        return ""


@pytest.fixture(scope="package", autouse=True)
def fault_figures() -> Iterator[None]:
    started = time.monotonic()
    yield
    if not _figures:
        return
    ARTIFACTS.mkdir(exist_ok=True)
    run = {
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": f"{host_platform.node()} ({os.cpu_count()} cores)",
        "tier_seconds": round(time.monotonic() - started, 1),
        "database": connection.vendor,
    }
    path = figures_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run, "scenarios": list(_figures.values())}, indent=2))
    (ARTIFACTS / "faults.md").write_text(markdown_table(run, list(_figures.values())))
    print(f"\n[faults] figures written to {path} and faults.md")
    print(f"{'scenario':<60}{'converged':>11}{'stuck':>7}{'lost':>6}")
    for row in _figures.values():
        seconds = row["converged_seconds"]
        shown = f"{seconds:.1f} s" if seconds is not None else "never"
        print(
            f"{row['scenario']:<60}{shown:>11}{row['rows_stuck']:>7}{row['audit_events_lost']:>6}"
        )


def markdown_table(run: dict, rows: list[dict]) -> str:
    """The fault table of docs/figures.md, from one run's figures (the same
    rows scripts/figures.py renders there)."""
    lines = fault_rows(rows)
    lines.append("")
    lines.append(
        f"Run of {run['finished_at']} on {run['branch']} at {run['commit']}"
        f"{' (uncommitted changes)' if run['dirty'] else ''}, {run['machine']}, "
        f"{run['database']}; the tier took {run['tier_seconds']:.0f} s."
    )
    return "\n".join(lines) + "\n"
