"""`make run` itself (scripts/run.sh, without vLLM): the worker is SIGKILLed and
comes back while the web server keeps answering; Ctrl-C (SIGINT to the whole
process group, as a terminal sends it) stops every process."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.scripts.test_supervise import _alive, _pids, _wait_for

pytestmark = pytest.mark.stress
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_make_run_restarts_a_killed_worker_and_stops_on_ctrl_c(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.update(
        VAR_DIR=str(tmp_path / "var"),
        RUN_WITHOUT_VLLM="1",
        PORT=str(port),
        DOOR_PORT=str(_free_port()),
    )
    # The web server, three workers, beat, and the front door where HAProxy is installed.
    programs = 6 if shutil.which("haproxy") else 5
    output = (tmp_path / "run.out").open("wb")
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"], cwd=REPO, env=env, stdout=output,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log = tmp_path / "var" / "log" / "supervisor.log"
    try:
        _wait_for(lambda: _healthy(port), 150, "the web server")
        pids = _wait_for(lambda: len(_pids(log)) == programs and _pids(log), 30, "the programs")
        worker = pids["worker-rollouts"][0]

        os.kill(worker, signal.SIGKILL)

        again = _wait_for(
            lambda: len(_pids(log).get("worker-rollouts", [])) == 2 and _pids(log), 30, "restart"
        )
        assert _alive(again["worker-rollouts"][1])
        assert _healthy(port)
        others = [pids[0] for name, pids in again.items() if name != "worker-rollouts"]
        assert [pid for pid in others if not _alive(pid)] == []

        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C
        assert run.wait(timeout=60) == 0
        everything = [pid for pids in _pids(log).values() for pid in pids]
        assert [pid for pid in everything if _alive(pid)] == []
        assert not _healthy(port)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        output.close()
