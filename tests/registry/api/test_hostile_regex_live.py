"""A crafted regex in an upload no longer pins the web process (issue 14).

With Python's `re`, `target_modules: "(a+)+"` against a module named 40 a's
and a "!" backtracks ~2**40 steps holding the GIL, and /readyz stopped
answering for minutes. This starts the registry under gunicorn in its own
process (a thread in this process would freeze with it), one worker with
threads (tests/support/web_server.py), uploads that adapter, and asks /readyz
of the same worker while the upload is answered.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.registry.ingest.hostile_corpus import HOSTILE_ARTIFACTS
from tests.support.web_server import registry_web_server

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
    # Threads in one process: /readyz is answered beside the upload, by the
    # same interpreter, so a regex holding the GIL would stop it answering.
    with registry_web_server(tmp_path, SETUP, threads=4) as (url, output):
        adapter_id, secret = output.split()[-2:]
        yield url, adapter_id, secret


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
            # A pinned process does not answer for minutes; 10 s leaves room for
            # the light run's stalls (niced beside vLLM), where 2 s did not.
            status = http.get(f"{url}/readyz", timeout=10).status_code
        except requests.RequestException as error:
            status = repr(error)
        health.append((status, round(time.monotonic() - started, 2)))
        if len(health) > 20:
            break
    thread.join(timeout=30)

    assert all(status == 200 for status, _ in health), health
    assert answer["status"] == 400, answer
    assert answer["body"]["error"]["code"] == "target_modules_mismatch"
    assert answer["seconds"] < 20, answer  # minutes when the regex backtracks
