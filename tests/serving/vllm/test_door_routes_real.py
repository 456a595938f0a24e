"""The front door: a real HAProxy (Debian's 2.6) in front of the two real vLLM
servers of this tier. Routing by `model`, vLLM's 404 for an unknown model,
reconfiguration without dropping a request, and a version swap through the
product's own rollout under continuous traffic that fails no request."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from serving.door.haproxy import HAProxyFrontDoor
from serving.door.routing import ReplicaView, ServedView, routing_table
from serving.models import Deployment, HttpAttempt
from tests.serving.vllm.conftest import SERVED_BASE, adapters_on, ok
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.haproxy import (
    needs_haproxy,
    open_access,
    requests_by_server,
    retried_requests,
    running_haproxy,
    vllm_404s,
)
from tests.support.vllm_servers import free_port

pytestmark = [
    pytest.mark.vllm,
    needs_haproxy,
]


def complete(url: str, model: str, session=None) -> requests.Response:
    body = {"model": model, "prompt": "The contract says", "max_tokens": 1, "temperature": 0}
    return (session or requests).post(url + "/v1/completions", json=body, timeout=60)


class Traffic:
    """Clients sending completions for `model` through the front door until stopped."""

    def __init__(self, url: str, model: str, clients: int = 3):
        self.url, self.model = url, model
        self.statuses: Counter = Counter()
        self.bodies: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            try:
                response = complete(self.url, self.model, session)
                status, text = response.status_code, response.text
            except requests.RequestException as error:
                status, text = 0, str(error)
            with self._lock:
                self.statuses[status] += 1
                if status != 200:
                    self.bodies.append(text[:300])

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def failed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)


def routed_after(url: str, model: str, timeout: float = 90) -> float:
    """Seconds until the front door answers 200 for `model`: at once after a
    promotion (the rollout's last step gives it a free slot, no reload); a
    reload (a replica added) has taken tens of seconds now and then in this
    test process (docs/door.md), so the wait is bounded, not zero."""
    started = time.monotonic()
    while complete(url, model).status_code != 200:
        assert time.monotonic() - started < timeout, f"{model} not routed after {timeout} s"
        time.sleep(0.5)
    return time.monotonic() - started


def logged(log: Path, lines: int, backend: str = "m_legal-contracts") -> Counter:
    """HAProxy's log once it holds `lines` lines for `backend` (it writes each
    line as the request ends, a moment after the client has its answer)."""
    deadline = time.monotonic() + 10
    while True:
        counts = requests_by_server(log)
        if sum(n for key, n in counts.items() if key[0] == backend) >= lines:
            return counts
        assert time.monotonic() < deadline, counts
        time.sleep(0.1)


def _log_sizes(servers) -> list[int]:
    return [server.log_path.stat().st_size for server in servers]


def _no_client_saw_it(traffic: Traffic, servers, sizes: list[int], log: Path) -> None:
    """Every request of `traffic` answered (more than 20), none reached a replica
    while it lacked the adapter (vLLM logged no 404 since `sizes`), and none
    needed HAProxy's retry on another replica to hide it."""
    assert traffic.statuses[200] > 20
    assert traffic.failed() == 0, (traffic.statuses, traffic.bodies[:5])
    for server, since in zip(servers, sizes, strict=True):
        assert vllm_404s(server.log_path, since) == 0, server.name
    assert retried_requests(log) == 0


def _table(servers, loaded: list[dict], served: list[ServedView]):
    return routing_table(
        deployment="gw",
        base_model=SERVED_BASE,
        replicas=[
            ReplicaView(id=i + 1, base_url=s.base_url, down=False, loaded=loaded[i])
            for i, s in enumerate(servers)
        ],
        served=served,
    )


def _deployment_behind_a_front_door(platform, vllm_servers, settings, tmp_path, name):
    """A deployment of both real replicas with a front door (HAProxy's first
    configuration written): (the deployment, the front door's URL)."""
    from serving.door.services import door_sync

    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {name: listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.SERVING_DOOR_DRAIN_SECONDS = 30.0
    platform.create_deployment(name, [s.base_url for s in vllm_servers], open_door=True)
    deployment = Deployment.objects.get(name=name)
    door_sync(deployment)  # the configuration HAProxy starts with
    return deployment, f"http://{listen}"


@pytest.fixture
def front_door(tmp_path) -> HAProxyFrontDoor:
    return HAProxyFrontDoor(tmp_path / "gateway", listen=f"127.0.0.1:{free_port()}")


def test_an_adapter_goes_only_to_the_replicas_that_hold_it_and_follows_them_without_a_reload(
    vllm_servers, front_door, tmp_path
):
    a, b = vllm_servers
    path = str(write_adapter_dir(tmp_path / "contracts-v1", AdapterSpec(seed=1)))
    with a.client(timeout=30) as client:
        assert client.load_adapter("legal-contracts", path).ok
    served = [ServedView("legal-contracts", path, held=False)]
    front_door.write(_table(vllm_servers, [{"legal-contracts": path}, {}], served))
    log = tmp_path / "haproxy.log"
    url = f"http://{front_door.listen}"
    with running_haproxy(front_door, log=log, access=open_access()):
        sizes = _log_sizes(vllm_servers)
        for _ in range(6):
            assert complete(url, "legal-contracts").status_code == 200
        counts = logged(log, 6)
        assert counts[("m_legal-contracts", "r1", 200)] == 6
        assert counts[("m_legal-contracts", "r2", 200)] == 0
        assert vllm_404s(b.log_path, sizes[1]) == 0  # b was never asked

        # b gets it too: one runtime command, the same worker (no reload).
        with b.client(timeout=30) as client:
            assert client.load_adapter("legal-contracts", path).ok
        worker = front_door.runtime.worker_pid()
        changes = front_door.apply(_table(vllm_servers, [{"legal-contracts": path}] * 2, served))
        assert changes == ["set server m_legal-contracts/r2 state ready"]
        assert front_door.runtime.worker_pid() == worker
        for _ in range(6):
            assert complete(url, "legal-contracts").status_code == 200
        counts = logged(log, 12)
        assert counts[("m_legal-contracts", "r2", 200)] >= 1
        assert counts[("m_legal-contracts", "r1", 200)] >= 7

        # Retired: the map entry goes at once, a 404 from the front door itself.
        assert front_door.apply(_table(vllm_servers, [{}, {}], [])) == [
            f"del map {front_door.map_path} legal-contracts"
        ]
        assert complete(url, "legal-contracts").status_code == 404
    assert retried_requests(log) == 0


def test_an_unknown_model_gets_vllm_s_own_404_and_the_base_model_any_replica(
    vllm_servers, front_door, tmp_path
):
    a, _ = vllm_servers
    front_door.write(_table(vllm_servers, [{}, {}], []))
    log = tmp_path / "haproxy.log"
    url = f"http://{front_door.listen}"
    with running_haproxy(front_door, log=log, access=open_access()):
        # A name the served-name pattern refuses is the door's 400 (fail closed:
        # door.lua proves the model before routing); a well-formed unknown one
        # gets vLLM's own 404.
        assert complete(url, 'no-such "adapter"').status_code == 400
        model = "no-such-adapter"
        through_door = complete(url, model)
        direct = complete(a.base_url, model)
        assert through_door.status_code == direct.status_code == 404
        ours, theirs = through_door.json()["error"], direct.json()["error"]
        assert set(ours) == set(theirs)
        assert {k: ours[k] for k in ("type", "param", "code")} == {
            k: theirs[k] for k in ("type", "param", "code")
        }
        assert ours["message"] == f"The model `{model}` does not exist."
        # vLLM goes on to list every name it serves; the front door does not.
        assert theirs["message"].startswith(ours["message"])
        assert through_door.headers["content-type"] == "application/json"

        for _ in range(4):
            assert complete(url, SERVED_BASE).status_code == 200
        counts = logged(log, 4, backend="base")
        assert counts[("base", "r1", 200)] >= 1 and counts[("base", "r2", 200)] >= 1

        # Clients get the OpenAI API only: no loading adapters through the front door.
        refused = requests.post(
            url + "/v1/load_lora_adapter",
            json={"lora_name": "sneaky", "lora_path": str(tmp_path)},
            timeout=10,
        )
        assert refused.status_code == 404
        assert "sneaky" not in adapters_on(a)
        # A body larger than the front door reads is refused, not routed by half of it.
        huge = {"model": SERVED_BASE, "prompt": "x" * (1100 * 1024), "max_tokens": 1}
        too_large = requests.post(url + "/v1/completions", json=huge, timeout=30)
        assert too_large.status_code == 413
        assert too_large.json()["error"]["code"] == 413


@pytest.mark.parametrize("slots", [16, 0], ids=["free slots, no reload", "reloads"])
def test_adding_adapters_drops_no_request_in_a_free_slot_or_by_reload(
    vllm_servers, tmp_path, slots
):
    front_door = HAProxyFrontDoor(
        tmp_path / "gateway", listen=f"127.0.0.1:{free_port()}", slots=slots
    )
    front_door.write(_table(vllm_servers, [{}, {}], []))
    url = f"http://{front_door.listen}"
    loaded: dict[str, str] = {}
    with running_haproxy(front_door, log=tmp_path / "haproxy.log", access=open_access()):
        with Traffic(url, SERVED_BASE) as traffic:
            for n in range(4):
                name = f"added-{n}"
                loaded[name] = str(write_adapter_dir(tmp_path / name, AdapterSpec(seed=n)))
                for server in vllm_servers:
                    with server.client(timeout=30) as client:
                        assert client.load_adapter(name, loaded[name]).ok
                worker = front_door.runtime.worker_pid()
                served = [ServedView(m, p, held=False) for m, p in loaded.items()]
                changes = front_door.apply(_table(vllm_servers, [loaded, loaded], served))
                # A slot while one is free; without (or once the pool is used up), a reload.
                assert changes[0].startswith("reload") == (slots == 0)
                assert (front_door.runtime.worker_pid() == worker) == (slots > 0)
                assert complete(url, name).status_code == 200
                time.sleep(0.5)
        assert traffic.statuses[200] > 20
        assert traffic.failed() == 0, traffic.bodies[:5]


@pytest.mark.django_db(transaction=True)
def test_a_version_swap_through_the_front_door_fails_no_request(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {"gw-cpu": listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.SERVING_DOOR_DRAIN_SECONDS = 30.0
    # Every replica swapped (no copy of v1 kept for a rollback: the next test's).
    settings.SERVING_ROLLBACK_RETAIN_SECONDS = 0
    platform.create_deployment("gw-cpu", [s.base_url for s in vllm_servers], open_door=True)
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    v2 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=2))
    from serving.door.services import door_sync, front_door_for

    deployment = Deployment.objects.get(name="gw-cpu")
    door_sync(deployment)  # the configuration HAProxy starts with
    door = front_door_for(deployment)
    log = tmp_path / "haproxy.log"
    url = f"http://{listen}"
    with running_haproxy(door, log=log, access=open_access()):
        first = platform.promote_and_wait("gw-cpu", v1["id"])
        assert first["status"] == "succeeded", first["error"]
        # Routed once verified: the rollout's own last step (a free slot, no
        # reload), no reconcile needed.
        assert routed_after(url, "legal-contracts") < 5

        sizes = _log_sizes(vllm_servers)
        with Traffic(url, "legal-contracts") as traffic:
            time.sleep(2)
            swap = platform.promote_and_wait("gw-cpu", v2["id"])
            time.sleep(2)
        assert swap["status"] == "succeeded", swap["error"]
        _no_client_saw_it(traffic, vllm_servers, sizes, log)
        for server in vllm_servers:
            assert adapters_on(server) == {"legal-contracts": swap["served_path"]}

    # The swap went one replica at a time: drained, swapped, back, and recorded.
    changes = list(
        HttpAttempt.objects.filter(purpose="gateway", started_at__gte=swap["started_at"])
        .order_by("started_at", "id")
        .values_list("url", flat=True)
    )
    # Its backend: its own, or the free slot it took when first promoted.
    moves = [
        re.search(r"(?:m_legal-contracts|slot_\d+)/(r\d+) state (\w+)", c).groups() for c in changes
    ]
    first, second = moves[0][0], moves[2][0]  # in the rollout's order (by URL)
    assert first != second
    assert moves == [
        (first, "drain"),
        (first, "ready"),
        (second, "drain"),
        (second, "ready"),
    ], changes
    state = ok(platform.admin.get("/api/v1/deployments/gw-cpu/state/"))
    assert state is not None
    assert (
        Path(settings.SERVING_DOOR_DIR / "gw-cpu" / "models.map")
        .read_text()
        .count("legal-contracts m_legal-contracts")
        == 1
    )


@pytest.mark.django_db(transaction=True)
def test_a_swap_that_fails_verification_rolls_back_without_failing_a_request(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    """The second replica (in the rollout's order) refuses the new version's
    probe: the first is already on it. Traffic goes back to the old version
    and the rollback goes one replica at a time; no client sees a failure."""
    from tests.support.fault_proxy import FaultProxy

    a, b = vllm_servers
    with FaultProxy(a.base_url) as one, FaultProxy(b.base_url) as other:
        # The rollout goes through the replicas by URL: the one that sorts second fails.
        _, faulty = sorted([one, other], key=lambda proxy: proxy.base_url)
        faulty.fail_probes_only = True
        urls = sorted([one.base_url, other.base_url])
        listen = f"127.0.0.1:{free_port()}"
        settings.SERVING_DOORS = {"gw-fail": listen}
        settings.SERVING_DOOR_DIR = tmp_path / "gateways"
        # Both replicas swapped (none keeps v1 for a rollback), so the second is tried.
        settings.SERVING_ROLLBACK_RETAIN_SECONDS = 0
        platform.create_deployment("gw-fail", urls, open_door=True)
        v1 = platform.approved_version("memos", "legal-memos", AdapterSpec(seed=3))
        v2 = platform.approved_version("memos", "legal-memos", AdapterSpec(seed=4))
        from serving.door.services import door_sync, front_door_for

        deployment = Deployment.objects.get(name="gw-fail")
        door_sync(deployment)
        log = tmp_path / "haproxy.log"
        url = f"http://{listen}"
        with running_haproxy(front_door_for(deployment), log=log, access=open_access()):
            first = platform.promote_and_wait("gw-fail", v1["id"])
            assert first["status"] == "succeeded", first["error"]
            routed_after(url, "legal-memos")
            faulty.fail_completions_for.add("legal-memos")
            with Traffic(url, "legal-memos") as traffic:
                time.sleep(1)
                swap = platform.promote_and_wait("gw-fail", v2["id"])
                time.sleep(1)
            assert swap["status"] == "rolled_back", swap
            assert traffic.statuses[200] > 10
            assert traffic.failed() == 0, (traffic.statuses, traffic.bodies[:5])
            for server in vllm_servers:
                assert adapters_on(server) == {"legal-memos": first["served_path"]}
            assert complete(url, "legal-memos").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_an_adapter_on_one_of_two_replicas_swaps_made_before_break_and_rolls_back_by_a_switch(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    """Placement holds legal-briefs on ONE replica (max_replicas 1). Its swap
    loads v2 on the other replica, sends the traffic there, then drains the
    first, which keeps v1 loaded; a rollback then switches the traffic back to
    it (no reload). Under continuous traffic, through the real front door."""
    deployment, url = _deployment_behind_a_front_door(
        platform, vllm_servers, settings, tmp_path, "gw-one"
    )
    v1 = platform.approved_version("briefs", "legal-briefs", AdapterSpec(seed=5))
    v2 = platform.approved_version("briefs", "legal-briefs", AdapterSpec(seed=6))
    ok(
        platform.member.put(
            "/api/v1/deployments/gw-one/placement/",
            {"adapter": v1["adapter"], "min_replicas": None, "max_replicas": 1},
            format="json",
        )
    )
    from serving.door.services import front_door_for

    log = tmp_path / "haproxy.log"
    with running_haproxy(front_door_for(deployment), log=log, access=open_access()):
        first = platform.promote_and_wait("gw-one", v1["id"])
        assert first["status"] == "succeeded", first["error"]
        routed_after(url, "legal-briefs")
        [home] = [s for s in vllm_servers if "legal-briefs" in adapters_on(s)]
        [spare] = [s for s in vllm_servers if s is not home]

        sizes = _log_sizes(vllm_servers)
        with Traffic(url, "legal-briefs") as traffic:
            time.sleep(2)
            swap = platform.promote_and_wait("gw-one", v2["id"])
            time.sleep(2)
            assert swap["status"] == "succeeded", swap["error"]
            assert adapters_on(spare) == {"legal-briefs": swap["served_path"]}
            assert adapters_on(home) == {"legal-briefs": first["served_path"]}  # kept
            served_by = requests_by_server(log)

            back = ok(platform.admin.post(f"/api/v1/rollouts/{swap['id']}/rollback/"), 202)
            rollback = platform.wait_rollout(back["id"])
            time.sleep(2)
        assert rollback["status"] == "succeeded", rollback["error"]
        _no_client_saw_it(traffic, vllm_servers, sizes, log)
        # Both replicas answered during the swap: the old until the new took over.
        # (Its backend: its own, or the free slot it took when first promoted.)
        briefs = {"m_legal-briefs"} | {key[0] for key in served_by if key[0].startswith("slot_")}
        assert len({key[1] for key in served_by if key[0] in briefs}) == 2, served_by
        # The rollback was a switch: v1 was never unloaded or loaded again there.
        assert adapters_on(home) == {"legal-briefs": first["served_path"]}
        reloads = HttpAttempt.objects.filter(
            replica__base_url=home.base_url,
            purpose__in=["load", "unload"],
            status_code=200,
            started_at__gte=swap["started_at"],
        )
        assert not reloads.exists(), list(reloads.values("purpose", "url"))
        # How long it took is bench/swap_through_gateway.py's figure, not a test's.


@pytest.mark.django_db(transaction=True)
def test_a_swap_on_every_replica_keeps_the_old_version_on_one_and_rolls_back_by_a_switch(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    """An adapter on both replicas (no bounds). Its swap goes one replica at a
    time but leaves the last on v1, drained, for SERVING_ROLLBACK_RETAIN_SECONDS;
    the rollback then sends the traffic back to it at once (no reload there) and
    swaps the other back after. Under continuous traffic, through the front door."""
    deployment, url = _deployment_behind_a_front_door(
        platform, vllm_servers, settings, tmp_path, "gw-keep"
    )
    v1 = platform.approved_version("notes", "legal-notes", AdapterSpec(seed=7))
    v2 = platform.approved_version("notes", "legal-notes", AdapterSpec(seed=8))
    from serving.door.services import front_door_for

    log = tmp_path / "haproxy.log"
    with running_haproxy(front_door_for(deployment), log=log, access=open_access()):
        first = platform.promote_and_wait("gw-keep", v1["id"])
        assert first["status"] == "succeeded", first["error"]
        routed_after(url, "legal-notes")

        sizes = _log_sizes(vllm_servers)
        with Traffic(url, "legal-notes") as traffic:
            time.sleep(2)
            swap = platform.promote_and_wait("gw-keep", v2["id"])
            time.sleep(1)
            assert swap["status"] == "succeeded", swap["error"]
            held = sorted(adapters_on(s)["legal-notes"] for s in vllm_servers)
            assert held == sorted([first["served_path"], swap["served_path"]])
            [kept] = [
                s for s in vllm_servers if adapters_on(s)["legal-notes"] == first["served_path"]
            ]

            back = ok(platform.admin.post(f"/api/v1/rollouts/{swap['id']}/rollback/"), 202)
            rollback = platform.wait_rollout(back["id"])
            time.sleep(1)
        assert rollback["status"] == "succeeded", rollback["error"]
        _no_client_saw_it(traffic, vllm_servers, sizes, log)
        for server in vllm_servers:
            assert adapters_on(server) == {"legal-notes": first["served_path"]}
        # The replica that kept v1 was never unloaded or loaded again.
        reloads = HttpAttempt.objects.filter(
            replica__base_url=kept.base_url,
            purpose__in=["load", "unload"],
            status_code=200,
            started_at__gte=swap["started_at"],
        )
        assert not reloads.exists(), list(reloads.values("purpose", "url"))
    # The rollback's first change at the front door put the kept replica back;
    # the other was drained right after, before it was swapped back.
    changes = list(
        HttpAttempt.objects.filter(purpose="gateway", started_at__gte=rollback["started_at"])
        .order_by("started_at", "id")
        .values_list("url", flat=True)
    )
    moves = [
        re.search(r"(?:m_legal-notes|slot_\d+)/(r\d+) state (\w+)", c).groups() for c in changes
    ]
    assert [state for _, state in moves[:2]] == ["ready", "drain"], changes
    assert moves[0][0] != moves[1][0], changes
