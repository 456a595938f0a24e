"""clients/python/examples/promote_on_approval.py, the receiver a pipeline runs
to promote once a person approved: a real process taking the registry's signed
deliveries and promoting through the live server with the pipeline's token."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from core.actors import Actor
from core.models import Ability
from core.services.tokens import token_create
from notifications.models import Delivery
from notifications.services.webhooks import delivery_attempt, delivery_redeliver, webhook_create
from serving.models import Promotion
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.notifications.conftest import fan_out_all
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.vllm_servers import free_port
from tests.support.vllm_standin import serve_standin

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "clients/python/examples/promote_on_approval.py"


@pytest.fixture
def receiver(live_server, legal, lena, root, tmp_path):
    _, token = token_create(
        actor=actor(lena), department=legal, name="pipeline", abilities=[Ability.PROMOTE]
    )
    port = free_port()
    webhook, secret = webhook_create(
        actor=Actor(user=root),
        department=legal,
        url=f"http://127.0.0.1:{port}/hooks/registry",
        kinds=["version.approved"],
        allow_internal=True,
    )
    log = tmp_path / "receiver.log"
    env = {
        **os.environ,
        "LORA_REGISTRY_URL": live_server.url,
        "LORA_REGISTRY_TOKEN": token,
        "WEBHOOK_SECRET": secret,
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--deployment", "staging-cpu",
             "--listen", f"127.0.0.1:{port}"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while "listening" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield webhook, log, port
    process.kill()
    process.wait(timeout=10)


def _printed(log: Path, count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while len(lines := log.read_text().splitlines()[1:]) < count:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return lines


def test_an_approval_is_promoted_once_however_often_it_is_delivered(
    receiver, lena, alex, root, legal, tmp_path
):
    webhook, log, _ = receiver
    replicas = [serve_standin(), serve_standin()]
    try:
        make_deployment(root, [r.base_url for r in replicas], tmp_path / "volume")
        adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
        version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=61))
        fan_out_all()
        delivery = Delivery.objects.get(webhook=webhook)

        assert delivery_attempt(delivery.pk, "worker-a") == "delivered"
        (line,) = _printed(log, 1)
        promotion = Promotion.objects.get(version=version)
        event = delivery.event.uid
        assert f"version.approved {event}: promoted version 1 of legal-contracts" in line
        assert f"promotion {promotion.pk}" in line

        # The same event again (a redelivery, a worker killed after sending): no second promotion.
        again = delivery_redeliver(actor=Actor(user=root), delivery=delivery)
        assert delivery_attempt(again.pk, "worker-a") == "delivered"
        time.sleep(1)
        assert Promotion.objects.filter(version=version).count() == 1
        assert len(log.read_text().splitlines()) == 2
    finally:
        for replica in replicas:
            replica.close()


def test_a_request_without_the_registrys_signature_is_refused(receiver):
    _, log, port = receiver
    forged = b'{"id": "x", "type": "version.approved", "data": {}}'
    response = requests.post(
        f"http://127.0.0.1:{port}/hooks/registry",
        data=forged,
        headers={"X-LoRA-Registry-Signature": f"t={int(time.time())},v1=00"},
        timeout=10,
    )
    assert response.status_code == 400
    assert Promotion.objects.count() == 0
    assert log.read_text().splitlines()[1:] == []
