"""The embedded broker under load: several processes (like web and beat) and
their threads enqueue at once while a real `celery worker` subprocess consumes.
Zero worker crashes, zero lost tasks, none delivered twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.stress

REPO = Path(__file__).resolve().parents[2]
PRODUCERS, THREADS, PER_THREAD = 3, 4, 40


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.update(
        VAR_DIR=str(tmp_path / "var"),
        CELERY_BROKER_URL=f"sqlite:///{tmp_path / 'var' / 'broker.sqlite3'}",
        STRESS_OUT=str(tmp_path / "out"),
        DJANGO_SECRET_KEY="stress-test-only",
    )
    env.pop("DATABASE_URL", None)  # the task touches no database
    return env


def test_many_producers_and_a_worker_lose_nothing(tmp_path):
    (tmp_path / "out").mkdir()
    env = _env(tmp_path)
    log = tmp_path / "worker.log"
    with open(log, "wb") as handle:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.broker_stress", "worker",
             "--concurrency=2", "--loglevel=INFO", "-Q", "celery"],
            cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        started = time.monotonic()
        producers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.broker_stress",
                    f"p{n}",
                    str(THREADS),
                    str(PER_THREAD),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            for n in range(PRODUCERS)
        ]
        for producer in producers:
            output, _ = producer.communicate(timeout=90)
            assert producer.returncode == 0, output.decode(errors="replace")[-3000:]
        sent = time.monotonic() - started

        expected = PRODUCERS * THREADS * PER_THREAD
        out = tmp_path / "out"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(out.iterdir())) < expected:
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        done = time.monotonic() - started
        names = {p.name for p in out.iterdir()}
        print(f"\n{expected} tasks from {PRODUCERS}x{THREADS} producers: sent in {sent:.1f} s, "
              f"all consumed after {done:.1f} s")  # fmt: skip

        assert worker.poll() is None, "the worker died"
        assert not [n for n in names if n.endswith(".again")], "a task ran twice"
        missing = {
            f"p{p}-{t}-{n}"
            for p in range(PRODUCERS)
            for t in range(THREADS)
            for n in range(PER_THREAD)
        } - names
        assert not missing, f"{len(missing)} tasks lost, e.g. {sorted(missing)[:5]}"
        text = log.read_text(errors="replace")
        assert "Unrecoverable error" not in text and "Traceback" not in text, text[-3000:]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
