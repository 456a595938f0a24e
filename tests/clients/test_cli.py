"""The `lora-registry` CLI (clients/python) as a pipeline runs it: a real process
against the live server, with a real Celery worker and stand-in replicas for the
rollout. Each exit code a pipeline branches on is reached at least once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connections

from config.celery import app as celery_app
from core.models import Ability
from core.services.tokens import token_create
from registry.models import AdapterVersion
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import serve_standin
from tests.support.workers import purge_queues

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pipeline_token(legal, lena):
    token, secret = token_create(
        actor=actor(lena), department=legal, name="pipeline",
        abilities=[Ability.REGISTER_VERSIONS, Ability.SUBMIT_FOR_REVIEW, Ability.PROMOTE],
    )  # fmt: skip
    return secret


@pytest.fixture
def cli(live_server, pipeline_token, tmp_path):
    def run(*args: str, url: str | None = None, timeout: float = 120) -> tuple[int, str, str]:
        env = {
            **os.environ,
            "LORA_REGISTRY_URL": url or live_server.url,
            "LORA_REGISTRY_TOKEN": pipeline_token,
        }
        done = subprocess.run(
            [sys.executable, "-m", "lora_registry_client.cli", *args],
            env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
        )  # fmt: skip
        return done.returncode, done.stdout, done.stderr

    return run


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts", served_name="legal-contracts")


def _peft_folder(where: Path, spec: AdapterSpec | None = None) -> Path:
    where.mkdir(parents=True)
    for name, content in (spec or AdapterSpec()).files().items():
        (where / name).write_bytes(content)
    return where


def test_register_a_folder_twice_gives_one_version_and_json_names_it(cli, contracts, tmp_path):
    folder = _peft_folder(tmp_path / "adapter")
    code, out, err = cli("register", "legal/contracts", str(folder), "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["number"] == 1 and first["status"] == "registered"

    # A retried pipeline step (same content, same derived key) is not a second version.
    code, out, err = cli("register", "legal/contracts", str(folder), "--json")
    assert code == 0, err
    assert json.loads(out)["id"] == first["id"]
    assert AdapterVersion.objects.filter(adapter=contracts).count() == 1

    # Without the key, the registry itself answers: the same artifact is refused.
    code, _, err = cli("register", "legal/contracts", str(folder), "--no-idempotency-key")
    assert code == 3, err
    assert AdapterVersion.objects.filter(adapter=contracts).count() == 1


def test_refusals_have_exit_codes_a_pipeline_can_branch_on(cli, contracts, tmp_path):
    bad = _peft_folder(tmp_path / "bad")
    (bad / "adapter_config.json").write_text("{not json")
    code, out, err = cli("register", "legal/contracts", str(bad), "--json")
    assert code == 3, err
    assert json.loads(out)["error"]["status"] == 400

    code, _, err = cli("register", "finance/invoices", str(bad))
    assert code == 4 and "No adapter finance/invoices" in err

    code, _, err = cli("register", "contracts", str(bad))
    assert code == 2 and "DEPARTMENT/NAME" in err

    code, _, err = cli("submit", "1", url=f"http://127.0.0.1:{free_port()}")
    assert code == 7 and "could not be reached" in err


@pytest.fixture
def worker():
    purge_queues(celery_app)
    with start_worker(
        celery_app, pool="threads", concurrency=2, perform_ping_check=False,
        shutdown_timeout=60, loglevel="WARNING",
    ):  # fmt: skip
        yield
    purge_queues(celery_app)
    connections.close_all()


@pytest.fixture
def replicas():
    fakes = [serve_standin(), serve_standin()]
    yield fakes
    for fake in fakes:
        fake.close()


def test_register_submit_promote_and_wait_until_served(
    cli, contracts, alex, root, replicas, worker, tmp_path
):
    make_deployment(root, [r.base_url for r in replicas], tmp_path / "volume")
    code, out, err = cli("register", "legal/contracts", str(_peft_folder(tmp_path / "a")), "--json")
    assert code == 0, err
    version_id = json.loads(out)["id"]

    code, out, err = cli("submit", str(version_id), "--json")
    assert code == 0 and json.loads(out)["status"] == "pending_review", err
    version_transition(
        actor=actor(alex), version=AdapterVersion.objects.get(id=version_id), action="approve"
    )

    code, out, err = cli("promote", "staging-cpu", str(version_id), "--wait", "--json",
                         "--interval", "0.2", "--timeout", "90")  # fmt: skip
    assert code == 0, err
    rollout = json.loads(out)
    assert rollout["status"] == "succeeded"
    assert rollout["replicas_summary"]["done"] == 2
    # Progress went to stderr, a line per status.
    assert "rollout" in err and "succeeded" in err
    for fake in replicas:
        assert "legal-contracts" in fake.adapters

    code, out, err = cli("rollouts", "watch", str(rollout["id"]), "--json")
    assert code == 0 and json.loads(out)["id"] == rollout["id"], err


def test_waiting_for_an_approval_that_does_not_come_times_out(
    cli, contracts, lena, alex, root, replicas, tmp_path
):
    make_deployment(root, [r.base_url for r in replicas], tmp_path / "volume",
                    requires_promotion_approval=True)  # fmt: skip
    code, out, err = cli("register", "legal/contracts", str(_peft_folder(tmp_path / "a")), "--json")
    version = AdapterVersion.objects.get(id=json.loads(out)["id"])
    version_transition(actor=actor(lena), version=version, action="submit")
    version_transition(actor=actor(alex), version=version, action="approve")

    code, out, err = cli("promote", "staging-cpu", str(version.id), "--wait", "--json",
                         "--interval", "0.2", "--timeout", "2")  # fmt: skip
    assert code == 6, err
    assert json.loads(out)["status"] == "pending_approval"
