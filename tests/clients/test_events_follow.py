"""`lora-registry events --follow` as a pipeline runs it: a real process
against the live server, tailing a department's events as they are
committed, more than one page between two polls, until Ctrl-C (exit 0)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.audit import audit_record
from core.models import Ability
from core.services.tokens import token_create
from tests.conftest import actor

pytestmark = pytest.mark.django_db(transaction=True)

# This checkout's client, whichever one the environment installed.
CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"


@pytest.fixture
def env(live_server, legal, lena):
    _, secret = token_create(
        actor=actor(lena), department=legal, name="tail", abilities=[Ability.READ_AUDIT]
    )
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(CLIENT), os.environ.get("PYTHONPATH")])),
        "LORA_REGISTRY_URL": live_server.url,
        "LORA_REGISTRY_TOKEN": secret,
    }


def happen(department, action: str) -> None:
    audit_record(actor=None, action=action, obj=department, department=department)


class Tail:
    """The CLI running, its stdout read line by line on a thread."""

    def __init__(self, env, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lora_registry_client.cli", "events", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def take(self, count: int, within: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + within
        taken = []
        while len(taken) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"only {len(taken)} of {count} lines: {taken}")
            try:
                taken.append(json.loads(self.lines.get(timeout=left)))
            except queue.Empty:
                continue
        return taken

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=30)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


def test_follow_prints_the_last_events_then_each_new_one_until_ctrl_c(env, legal, finance):
    for n in range(3):
        happen(legal, f"test.before{n}")
    tail = Tail(env, "legal", "--follow", "--json", "--last", "2", "--interval", "0.2",
                "--page-size", "3")  # fmt: skip
    try:
        assert [e["action"] for e in tail.take(2)] == ["test.before1", "test.before2"]
        # Seven while it sleeps: more than two pages of three, all in order.
        for n in range(7):
            happen(legal, f"test.after{n}")
        happen(finance, "test.elsewhere")  # another department's: not shown
        taken = tail.take(7)
        assert [e["action"] for e in taken] == [f"test.after{n}" for n in range(7)]
        assert all(e["department"] == "legal" for e in taken)
        happen(legal, "test.later")
        assert [e["action"] for e in tail.take(1)] == ["test.later"]
        time.sleep(0.6)  # a few more polls: nothing is shown twice
        assert tail.lines.empty()
    finally:
        code, err = tail.stop()
    assert code == 0, err
    assert "Traceback" not in err


def test_without_follow_it_prints_the_last_ones_and_ends(env, legal):
    for n in range(4):
        happen(legal, f"test.n{n}")
    done = subprocess.run(
        [sys.executable, "-m", "lora_registry_client.cli", "events", "legal", "--last", "3"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["test.n1", "test.n2", "test.n3"]


def test_a_page_size_past_the_apis_bound_is_a_usage_error(env, legal):
    done = subprocess.run(
        [sys.executable, "-m", "lora_registry_client.cli", "events", "legal", "--follow",
         "--page-size", "501"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--page-size must be 1 to 500" in done.stderr


def test_another_departments_events_are_not_found(env, finance):
    happen(finance, "test.secret")
    done = subprocess.run(
        [sys.executable, "-m", "lora_registry_client.cli", "events", "finance", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "test.secret" not in done.stdout
