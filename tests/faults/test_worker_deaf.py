"""9. The worker is alive but deaf: its main process is frozen (SIGSTOP), as a
worker that stopped consuming after a broker outage, or one stuck in a shutdown,
looks from outside. Its process is there, so waiting for an exit restarts
nothing. Under `make run`'s supervisor (scripts/supervise.py --liveness) the
worker's liveness ping stops (config/celery_liveness.py), the supervisor kills
and restarts it, and a promotion made meanwhile is served without anyone
touching it. A message the frozen worker had taken off the queue is lost with
it; the sweeper sends that rollout again."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config.celery_alive import age_seconds
from serving.models import Rollout
from tests.faults.conftest import REPO_ROOT, answers, wait_for
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec
from tests.support.processes import _WORKER

pytestmark = pytest.mark.django_db(transaction=True)

CONVERGE_SECONDS = 90
MAX_AGE_SECONDS = 5


class Supervised:
    """scripts/supervise.py running one worker with --liveness, as scripts/run.sh does."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.log_dir = log_dir
        worker = shlex.join([sys.executable, "-c", _WORKER, "deaf", "prefork", "2"])
        self.process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "scripts" / "supervise.py"),
             "--log-dir", str(log_dir), "--grace", "5",
             "--liveness-max-age", str(MAX_AGE_SECONDS), "--liveness-grace", "120",
             "--program", "worker", worker, "--liveness", "worker"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    @property
    def log(self) -> str:
        path = self.log_dir / "supervisor.log"
        return path.read_text() if path.exists() else ""

    def worker_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"started worker \(pid (\d+)", self.log)]

    @property
    def liveness(self) -> Path:
        return self.log_dir / "liveness" / "worker"

    def consuming(self) -> bool:
        age = age_seconds(self.liveness)
        return age is not None and age < MAX_AGE_SECONDS

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def supervised(stack):
    made: list[Supervised] = []

    def start() -> Supervised:
        made.append(Supervised(stack.env(WORKER_LIVENESS_INTERVAL_SECONDS="1"), stack.base_dir))
        return made[-1]

    yield start
    for supervisor in made:
        supervisor.close()
        log = supervisor.log_dir / "worker.log"
        if log.exists():
            print(f"\n--- supervisor.log ---\n{supervisor.log}\n--- worker.log ---")
            print(log.read_text(errors="replace")[-4000:])


def test_a_deaf_worker_is_restarted_by_its_liveness_check_and_the_rollout_converges(
    stack, supervised, platform, replicas, measure
):
    m = measure("9. worker alive but deaf (frozen): liveness check restarts it", CONVERGE_SECONDS)
    stack.use_broker("redis")
    supervisor = supervised()
    assert wait_for(supervisor.consuming, timeout=120) is not None, (
        f"the worker never consumed its liveness ping:\n{supervisor.log}"
    )
    stack.start_beat()
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=9))

    frozen = supervisor.worker_pids()[-1]
    os.kill(frozen, signal.SIGSTOP)
    # The fault does not end by itself: the clock runs from the freeze.
    m.fault_ended()
    frozen_at = time.monotonic()
    rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]

    def served_everywhere() -> bool:
        rollout = Rollout.objects.get(pk=rollout_id)
        return rollout.status == "succeeded" and all(
            answers(url, "legal-contracts") for url in (a.base_url, b.base_url)
        )

    m.converge(served_everywhere)
    m.settle()
    killed = re.search(r"worker consumed no liveness ping for (\d+) s", supervisor.log)
    m.notes.update(
        final_status=Rollout.objects.get(pk=rollout_id).status,
        worker_restarts=len(supervisor.worker_pids()) - 1,
        killed_after_seconds_without_ping=int(killed.group(1)) if killed else None,
        seconds_from_freeze=round(time.monotonic() - frozen_at, 1),
    )
    assert killed, f"the supervisor never found the frozen worker deaf:\n{supervisor.log}"
    assert len(supervisor.worker_pids()) >= 2 and frozen not in supervisor.worker_pids()[1:]
    m.check()
