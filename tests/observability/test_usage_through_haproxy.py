"""Usage counted from REAL requests through a REAL HAProxy front door (Debian's
haproxy 2.6) to stand-in vLLM replicas (tests/support/vllm_standin.py): after
the reconcile hook the usage page and the API show what was sent, errors
included, and a reload of HAProxy (its counters start again) loses no count."""

from __future__ import annotations

import pytest
import requests

from observability.models import DailyUsage
from observability.services import reconcile_finished
from serving.door.routing import ReplicaView, ServedView, routing_table
from serving.door.services import front_door_for
from serving.models import ServedAdapter
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import needs_haproxy, open_access, running_haproxy
from tests.support.vllm_servers import free_port

pytestmark = [
    pytest.mark.django_db,
    needs_haproxy,
]


def complete(url: str, model: str) -> int:
    body = {"model": model, "prompt": "The contract says", "max_tokens": 1}
    return requests.post(url + "/v1/completions", json=body, timeout=30).status_code


def tick(deployment) -> None:
    """What every reconcile ends with (serving.signals.reconcile_finished)."""
    reconcile_finished(None, deployment=deployment, seconds=0.01, ok=True, replicas=[])


def table(deployment, replicas, holders: set[int], path: str):
    return routing_table(
        deployment=deployment.name,
        base_model=replicas[0].base_model,
        replicas=[
            ReplicaView(
                id=i + 1,
                base_url=r.base_url,
                down=False,
                loaded={"legal-contracts": path} if i in holders else {},
            )
            for i, r in enumerate(replicas)
        ],
        served=[ServedView(name="legal-contracts", path=path, held=False)],
    )


def test_requests_through_the_front_door_show_on_the_usage_page(
    deployment, approved_v1, fake_replicas, settings, tmp_path, web_lena, as_lena
):
    settings.SERVING_DOORS = {deployment.name: f"127.0.0.1:{free_port()}"}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.OBSERVABILITY_VLLM_METRICS = False
    ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1, served_path="/v"
    )
    path = str(write_adapter_dir(tmp_path / "adapter", AdapterSpec(seed=1)))
    for replica in fake_replicas:
        loaded = requests.post(
            replica.base_url + "/v1/load_lora_adapter",
            json={"lora_name": "legal-contracts", "lora_path": path},
            timeout=10,
        )
        assert loaded.status_code == 200, loaded.text
    # Open (no keys): these tests are about routing; keys: test_door_haproxy.py.
    deployment.open_door = True
    deployment.save(update_fields=["open_door"])
    door = front_door_for(deployment)
    door.write(table(deployment, fake_replicas[:1], {0}, path))
    url = f"http://{door.listen}"
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        tick(deployment)  # nothing sent yet: nothing counted
        assert not DailyUsage.objects.exists()

        sent = [complete(url, "legal-contracts") for _ in range(6)]
        fake_replicas[0].fail_completion_for = {"legal-contracts"}
        sent += [complete(url, "legal-contracts") for _ in range(2)]
        fake_replicas[0].fail_completion_for = set()
        requests.post(
            fake_replicas[0].base_url + "/v1/unload_lora_adapter",
            json={"lora_name": "legal-contracts"},
            timeout=10,
        )
        sent += [complete(url, "legal-contracts")]  # the replica lost it: vLLM's 404
        assert sent == [200] * 6 + [500] * 2 + [404]
        tick(deployment)
        tick(deployment)  # the same counters again: nothing added

        # A second replica, that holds it: HAProxy reloads, its counters start again.
        worker = door.runtime.worker_pid()
        door.apply(table(deployment, fake_replicas, {1}, path))
        assert door.runtime.worker_pid() != worker
        more = [complete(url, "legal-contracts") for _ in range(3)]
        assert more == [200] * 3
        tick(deployment)

    row = DailyUsage.objects.get()
    assert (row.requests, row.errors_4xx, row.errors_5xx) == (12, 1, 2)
    assert row.version_id == approved_v1.pk

    page = web_lena.get("/usage/").content.decode()
    start = page.index(f'data-testid="usage-legal-contracts-v{approved_v1.number}"')
    cells = page[start : page.index("</tr>", start)]
    assert 'data-testid="requests">12<' in cells
    assert 'data-testid="errors-4xx">1<' in cells and 'data-testid="errors-5xx">2<' in cells
    (api_row,) = as_lena.get("/api/v1/usage/?department=legal").json()["rows"]
    assert (api_row["requests"], api_row["errors_4xx"], api_row["errors_5xx"]) == (12, 1, 2)
    # The adapter page's usage panel says the same, per deployment.
    panel = web_lena.get(f"/adapters/{approved_v1.adapter_id}/").content.decode()
    start = panel.index(f'data-testid="requests-{deployment.name}"')
    assert panel[start : panel.index("</td>", start)].endswith(
        '>12 <span class="small reason">(3 errors)</span>'
    )
