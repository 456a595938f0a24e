"""A traffic canary on the real front door (Debian's HAProxy 2.6) and the two
real vLLM servers of this tier, under continuous traffic: the stated share of
the adapter's requests goes to the new version while it bakes; a good version
passes its gates and takes all the traffic (its worker killed mid-bake and
resumed by the sweeper on the way); a broken one is rolled back by a traffic
switch, timed."""

from __future__ import annotations

import time

import pytest

from core.models import AuditEvent
from serving.models import Deployment, Rollout, ServedAdapter
from serving.volume import serve_path_for
from tests.serving.vllm.conftest import adapters_on, ok
from tests.serving.vllm.test_door_routes_real import Traffic, complete, routed_after
from tests.support.adapters import AdapterSpec
from tests.support.haproxy import needs_haproxy, open_access, running_haproxy
from tests.support.vllm_servers import free_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.django_db(transaction=True),
    needs_haproxy,
]

SHARE = 10


def _gateway(settings, tmp_path, name: str) -> str:
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {name: listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.SERVING_DOOR_DRAIN_SECONDS = 30.0
    return listen


def _wait_status(platform, rollout_id: int, wanted: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = platform.rollout(rollout_id)
        if body["status"] == wanted:
            return body
        assert body["status"] not in {"succeeded", "failed", "rolled_back"}, body
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


def _measured_share(body: dict) -> float:
    split = body["canary_split"]
    canary, old = split["canary"]["requests"], split["baseline"]["requests"]
    return canary / (canary + old)


def _actions(rollout_id: int) -> list[str]:
    return list(
        AuditEvent.objects.filter(object_type="serving.rollout", object_id=str(rollout_id))
        .order_by("id")
        .values_list("action", flat=True)
    )


def test_a_good_canary_bakes_on_its_share_survives_its_worker_and_takes_all_traffic(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    settings.SERVING_CLAIM_SECONDS = 3.0
    settings.SERVING_SWEEP_AFTER_SECONDS = 1.0
    listen = _gateway(settings, tmp_path, "canary-cpu")
    platform.create_deployment("canary-cpu", [s.base_url for s in vllm_servers], open_door=True)
    v1 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))
    v2 = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=2))
    from serving.door.services import door_sync, front_door_for
    from serving.rollouts.sweep import sweep_rollouts

    deployment = Deployment.objects.get(name="canary-cpu")
    door_sync(deployment)
    url = f"http://{listen}"
    with running_haproxy(
        front_door_for(deployment), log=tmp_path / "haproxy.log", access=open_access()
    ):
        first = platform.promote_and_wait("canary-cpu", v1["id"])
        assert first["status"] == "succeeded", first["error"]
        routed_after(url, "legal-contracts")
        with Traffic(url, "legal-contracts") as traffic:
            promotion = ok(
                platform.promote(
                    "canary-cpu", v2["id"], traffic_canary={"share": SHARE, "bake_seconds": 25}
                ),
                201,
            )
            rollout_id = promotion["rollout"]
            baking = _wait_status(platform, rollout_id, "baking")
            split = baking["canary_split"]
            assert split["share"] == SHARE
            assert 0 < split["seconds_left"] <= 25
            bake_until = split["bake_until"]
            time.sleep(6)
            # The worker dies mid-bake: its claim is taken from it (it stops at
            # its next heartbeat) and expires; the sweeper sends the rollout again.
            served = ServedAdapter.objects.get(
                deployment=deployment, adapter__served_name="legal-contracts"
            )
            before = platform.rollout(rollout_id)["canary_split"]
            ServedAdapter.objects.filter(pk=served.pk).update(lease_owner="killed-worker")
            time.sleep(2.5)
            ServedAdapter.objects.filter(pk=served.pk).update(lease_until=None, lease_owner="")
            assert sweep_rollouts() == [rollout_id]
            resumed = _wait_status(platform, rollout_id, "baking", timeout=60)
            assert resumed["canary_split"]["bake_until"] == bake_until
            done = platform.wait_rollout(rollout_id, timeout=180)
            time.sleep(1)
        assert done["status"] == "succeeded", done
        split = done["canary_split"]
        print(
            f"\n[canary] good: share {SHARE} % stated, {_measured_share(done):.1%} measured "
            f"({split['canary']['requests']} of "
            f"{split['canary']['requests'] + split['baseline']['requests']}); "
            f"clients {dict(traffic.statuses)}"
        )
        assert split["outcome"] == "passed", split
        assert split["verdict"] == "pass"
        # The counts went on across the worker's death: not started again at zero.
        assert split["canary"]["requests"] > before["canary"]["requests"] > 0
        assert abs(_measured_share(done) - SHARE / 100) < 0.04
        assert traffic.failed() == 0, (traffic.statuses, traffic.bodies[:5])
        for server in vllm_servers:
            assert adapters_on(server) == {"legal-contracts": done["served_path"]}
        assert complete(url, "legal-contracts").status_code == 200
    actions = _actions(rollout_id)
    assert "rollout.canary_started" in actions
    assert actions.count("rollout.canary_passed") == 1
    assert actions[-1] == "rollout.succeeded"
    assert ServedAdapter.objects.get(pk=served.pk).gateway_weights == {}


def test_a_broken_canary_is_switched_out_in_under_a_second_and_rolled_back(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    from tests.support.fault_proxy import FaultProxy

    a, b = vllm_servers
    with FaultProxy(a.base_url) as one, FaultProxy(b.base_url) as other:
        proxies = [one, other]
        listen = _gateway(settings, tmp_path, "canary-bad")
        platform.create_deployment(
            "canary-bad", sorted(p.base_url for p in proxies), open_door=True
        )
        v1 = platform.approved_version("memos", "legal-memos", AdapterSpec(seed=3))
        v2 = platform.approved_version("memos", "legal-memos", AdapterSpec(seed=4))
        from registry.models import AdapterVersion
        from serving.door.services import door_sync, front_door_for

        deployment = Deployment.objects.get(name="canary-bad")
        # v2 answers its probes and fails every client's request: a broken version.
        broken = serve_path_for(deployment, AdapterVersion.objects.get(pk=v2["id"]))
        for proxy in proxies:
            proxy.broken_roots.add(broken)
        door_sync(deployment)
        url = f"http://{listen}"
        with running_haproxy(
            front_door_for(deployment), log=tmp_path / "haproxy.log", access=open_access()
        ):
            first = platform.promote_and_wait("canary-bad", v1["id"])
            assert first["status"] == "succeeded", first["error"]
            routed_after(url, "legal-memos")
            with Traffic(url, "legal-memos") as traffic:
                time.sleep(1)
                rollout = platform.promote_and_wait(
                    "canary-bad", v2["id"], traffic_canary={"share": SHARE, "bake_seconds": 120}
                )
                failed_during = traffic.failed()
                time.sleep(2)
            assert rollout["status"] == "rolled_back", rollout
            split = rollout["canary_split"]
            switch = split["rollback"]
            print(
                f"\n[canary] broken: rolled back after {split['canary']['requests']} canary "
                f"requests ({split['canary']['errors']} errors), share "
                f"{_measured_share(rollout):.1%} measured; traffic switch "
                f"{switch['switch_ms']:.1f} ms, drained {switch['drained_ms']:.0f} ms, the old "
                f"version back on that replica after {switch['restored_ms']:.0f} ms; "
                f"clients {dict(traffic.statuses)}"
            )
            assert split["outcome"] == "failed"
            assert rollout["error"].startswith("Canary gates failed: errors: error rate")
            # Judged early (after the minimum of requests), not after its 120 s bake.
            started = Rollout.objects.get(pk=rollout["id"]).started_at.timestamp()
            assert time.time() - started < 90
            assert switch["switch_ms"] < 1000
            assert switch["restored_ms"] > switch["drained_ms"] >= switch["switch_ms"]
            assert abs(_measured_share(rollout) - SHARE / 100) < 0.05
            # The clients saw the canary's failures while it took its share, and
            # none once traffic left it.
            assert 0 < failed_during <= split["canary"]["errors"] + 6
            assert traffic.failed() == failed_during
            for proxy in proxies:
                assert adapters_on_proxy(proxy) == {"legal-memos": first["served_path"]}
            for _ in range(5):
                assert complete(url, "legal-memos").status_code == 200
    actions = _actions(rollout["id"])
    assert actions.index("rollout.canary_failed") < actions.index("rollout.canary_switched_back")
    assert actions[-1] == "rollout.rolled_back"


def adapters_on_proxy(proxy) -> dict:
    import requests

    listing = requests.get(proxy.base_url + "/v1/models", timeout=30).json()["data"]
    return {m["id"]: m.get("root") for m in listing if m.get("parent")}
