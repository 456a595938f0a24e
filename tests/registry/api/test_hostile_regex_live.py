"""A crafted regex in an upload no longer pins the web process (issue 14).

With Python's `re`, `target_modules: "(a+)+"` against a module named 40 a's
and a "!" backtracks ~2**40 steps holding the GIL, and /readyz stopped
answering for minutes. This starts the registry under `manage.py runserver`
in its own process (a thread in this process would freeze with it), uploads
that adapter, and asks /readyz while the upload is answered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from tests.registry.ingest.hostile_corpus import HOSTILE_ARTIFACTS
from tests.support.s3_server import free_port

ROOT = Path(__file__).resolve().parents[3]
SETUP = """
from django.contrib.auth import get_user_model
from core.actors import Actor
from core.models import Ability, Department, Membership, Role
from core.services.tokens import token_create
from registry.services.adapters import adapter_create
department = Department.objects.create(slug="legal", name="Legal")
user = get_user_model().objects.create_user(username="lena")
Membership.objects.create(user=user, department=department, role=Role.MEMBER)
adapter = adapter_create(actor=Actor(user=user), department=department, name="contracts",
                         base_model="tiny-llama")
_token, secret = token_create(actor=Actor(user=user), department=department, name="ci",
                              abilities=list(Ability.values))
print(adapter.pk, secret)
"""


@pytest.fixture
def server(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_"))},
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_SECRET_KEY": "test-only-" + uuid.uuid4().hex,
        "VAR_DIR": str(tmp_path / "var"),
        "LOG_LEVEL": "WARNING",
        "NO_PROXY": "127.0.0.1,localhost",
        # Production settings redirect to https; this server speaks plain http.
        "DJANGO_SECURE_SSL_REDIRECT": "false",
        "DJANGO_SECURE_COOKIES": "false",
    }

    def manage(*args):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "--noinput", "-v0")
    adapter_id, secret = manage("shell", "-c", SETUP).split()[-2:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            session = requests.Session()
            session.trust_env = False
            deadline = time.monotonic() + 60
            while True:
                try:
                    if session.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
            yield url, adapter_id, secret
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_readyz_answers_while_a_crafted_regex_upload_is_processed(server):
    url, adapter_id, secret = server
    artifact = next(a for a in HOSTILE_ARTIFACTS if a.name == "redos_target_modules")
    (name, data) = artifact.build()[0]
    answer = {}
    http = requests.Session()
    http.trust_env = False  # never through a proxy to loopback

    def upload():
        started = time.monotonic()
        response = http.post(
            f"{url}/api/v1/adapters/{adapter_id}/versions/",
            headers={"Authorization": f"Bearer {secret}"},
            files={"files": (name, data)},
            timeout=30,
        )
        answer.update(status=response.status_code, body=response.json())
        answer["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=upload)
    thread.start()
    health = []
    while thread.is_alive() or len(health) < 3:
        started = time.monotonic()
        try:
            status = http.get(f"{url}/readyz", timeout=2).status_code
        except requests.RequestException as error:
            status = repr(error)
        health.append((status, round(time.monotonic() - started, 2)))
        if len(health) > 20:
            break
    thread.join(timeout=30)

    assert all(status == 200 for status, _ in health), health
    assert answer["status"] == 400, answer
    assert answer["body"]["error"]["code"] == "target_modules_mismatch"
    assert answer["seconds"] < 5, answer
