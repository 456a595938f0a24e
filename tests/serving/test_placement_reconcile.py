"""Placement through the reconcile and the rollouts, against the vLLM stand-in:
an adapter with bounds is loaded (and verified) only where it is placed, is
unloaded where it is not once its placed replicas serve it, moves off a replica
that goes down, and is pushed by a rollout to its placed replicas only. An
in-sync tick with bounded adapters costs what one without does."""

from __future__ import annotations

import contextlib

import pytest
import requests

from serving.models import DriftEvent, DriftKind, Replica, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.rules.placement_plan import Reason, State
from tests.serving.conftest import make_deployment
from tests.serving.test_reconcile_scale import MAX_STATEMENTS
from tests.serving.test_rollouts import promote
from tests.support.fleet import fingerprints_record, measure, served_adapters_clone, standin_fleet
from tests.support.haproxy import needs_haproxy, open_access, running_haproxy
from tests.support.vllm_servers import free_port

pytestmark = pytest.mark.django_db

IDLE = (
    "# TYPE vllm:lora_requests_info gauge\n"
    'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
    'waiting_lora_adapters=""} 1.0\n'
)


@pytest.fixture
def fleet():
    with standin_fleet(3) as fleet:
        for replica in fleet.replicas:
            replica.metrics_text = IDLE  # the tick's own probes are not demand
        yield fleet


@pytest.fixture
def placed(root, fleet, tmp_path, approved_v1):
    """6 adapters, each on one replica by placement; max_cpu_loras 4 per replica."""
    deployment = make_deployment(root, fleet.urls, tmp_path / "volume", name="placed")
    served = served_adapters_clone(deployment, approved_v1, 6, prefix="one")
    ServedAdapter.objects.filter(deployment=deployment).update(max_replicas=1)
    fingerprints_record_first(deployment, fleet, served)
    return deployment, served


def fingerprints_record_first(deployment, fleet, served):
    """Fingerprints as the rollouts would have recorded them (on the first replica)."""
    first = fleet.replicas[0]
    for s in served:
        first.adapters[s.adapter.served_name] = s.served_path
    fingerprints_record(deployment, served)
    first.adapters.clear()


def _holders(fleet, name):
    return [i for i, r in enumerate(fleet.replicas) if name in r.adapters]


def test_each_adapter_is_loaded_only_where_it_is_placed_and_verified_there(placed, fleet):
    deployment, served = placed
    report = reconcile_deployment(deployment.pk, "beat")
    assert not report.skipped
    for s in served:
        assert len(_holders(fleet, s.adapter.served_name)) == 1, s.adapter.served_name
    # No replica past max_cpu_loras (4): 6 adapters over 3 replicas.
    assert all(len(r.adapters) <= 4 for r in fleet.replicas)
    kinds = set(DriftEvent.objects.values_list("kind", flat=True))
    assert DriftKind.PLACED_LOADED in kinds
    # Verified like a rollout: a completion through each adapter where it was loaded.
    completions = sum(
        1
        for r in fleet.replicas
        for _method, path, body in r.requests
        if "completions" in path and str(body.get("model", "")).startswith("one-")
    )
    assert completions >= 6
    for row in ServedAdapter.objects.filter(deployment=deployment):
        state = State.from_dict(row.placement)
        assert len(state.replicas) == 1
        assert state.reason == Reason.MAX or state.reason == Reason.MIN


def test_an_in_sync_tick_with_placement_costs_no_more_statements(placed, fleet):
    deployment, _ = placed
    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")
    tick = measure(lambda: reconcile_deployment(deployment.pk, "beat"))
    assert tick.result.in_sync == 3 and tick.result.repairs == []
    assert tick.statements <= MAX_STATEMENTS, tick.sql
    assert not [s for s in tick.sql if 'serving_servedadapter" SET' in s], tick.sql


def test_an_adapter_moves_off_a_replica_that_goes_down(placed, fleet):
    deployment, served = placed
    reconcile_deployment(deployment.pk, "beat")
    before = {s.adapter.served_name: _holders(fleet, s.adapter.served_name) for s in served}
    lost = fleet.replicas[0]
    lost.unavailable = 10**6  # answers 503 from now on
    reconcile_deployment(deployment.pk, "beat")
    for name, holders in before.items():
        now = [i for i in _holders(fleet, name) if i != 0]
        assert len(now) == 1, (name, now)
        if holders != [0]:
            assert now == holders  # only what the lost replica held moved


def test_an_unplaced_copy_is_unloaded_only_once_the_placed_replica_serves_it(placed, fleet):
    deployment, served = placed
    reconcile_deployment(deployment.pk, "beat")
    name = served[0].adapter.served_name
    [home] = _holders(fleet, name)
    row = ServedAdapter.objects.get(pk=served[0].pk)
    other = next(
        r
        for r in Replica.objects.filter(deployment=deployment)
        if r.pk not in State.from_dict(row.placement).replicas
    )
    elsewhere = next(r for r in fleet.replicas if r.base_url == other.base_url)
    # Placement moves it: the stored placement now names the other replica.
    row.placement = {**row.placement, "replicas": [other.pk]}
    ServedAdapter.objects.filter(pk=row.pk).update(placement=row.placement)
    reconcile_deployment(deployment.pk, "beat")
    # Loaded on the new replica; still on the old one (make before break).
    assert name in elsewhere.adapters
    assert name in fleet.replicas[home].adapters
    reconcile_deployment(deployment.pk, "beat")
    assert name not in fleet.replicas[home].adapters
    assert DriftEvent.objects.filter(kind=DriftKind.UNPLACED_UNLOADED, adapter_name=name).exists()


def test_a_rollout_pushes_to_the_placed_replicas_only(
    root, lena, fleet, tmp_path, contracts, approved_v1, approved_v2
):
    deployment = make_deployment(root, fleet.urls, tmp_path / "volume", name="rollout")
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, max_replicas=1)
    _, rollout = promote(lena, deployment, approved_v1)
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    holders = _holders(fleet, "legal-contracts")
    assert len(holders) == 1
    assert rollout.replica_steps.count() == 1
    served = ServedAdapter.objects.get(deployment=deployment)
    assert len(State.from_dict(served.placement).replicas) == 1

    # The swap goes to the same placed replica, and the reconcile leaves it there.
    _, swap = promote(lena, deployment, approved_v2)
    assert rollout_execute(swap.pk, "w") == "succeeded"
    assert _holders(fleet, "legal-contracts") == holders
    reconcile_deployment(deployment.pk, "beat")
    assert _holders(fleet, "legal-contracts") == holders


def test_a_rollout_that_finds_no_room_fails_and_says_so(
    root, lena, fleet, tmp_path, contracts, approved_v1
):
    deployment = make_deployment(
        root, fleet.urls, tmp_path / "volume", name="full", max_loras=1, max_cpu_loras=1
    )
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, max_replicas=1)
    _, rollout = promote(lena, deployment, approved_v1)  # the gate saw room
    # Adapters without bounds arrive meanwhile and fill every replica's one slot.
    served_adapters_clone(deployment, approved_v1, 1, prefix="full")
    assert rollout_execute(rollout.pk, "w") == "failed"
    rollout.refresh_from_db()
    assert rollout.error.startswith("No room")
    assert _holders(fleet, "legal-contracts") == []


@needs_haproxy
def test_behind_a_front_door_a_moved_adapter_is_drained_before_it_is_unloaded(
    placed, fleet, settings, tmp_path
):
    from serving.door.selectors import routing_table_for
    from serving.door.services import front_door_for
    from serving.models import HttpAttempt

    deployment, served = placed
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {deployment.name: listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    # Open (no keys): these tests are about routing; keys: test_door_haproxy.py.
    deployment.open_door = True
    deployment.save(update_fields=["open_door"])
    door = front_door_for(deployment)
    door.write(routing_table_for(deployment))
    name = served[0].adapter.served_name
    url = f"http://{listen}/v1/completions"
    body = {"model": name, "prompt": "hi", "max_tokens": 1}
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        reconcile_deployment(deployment.pk, "beat")  # placed, loaded, routed
        assert requests.post(url, json=body, timeout=10).status_code == 200
        row = ServedAdapter.objects.get(pk=served[0].pk)
        [home] = State.from_dict(row.placement).replicas
        other = Replica.objects.filter(deployment=deployment).exclude(pk=home).first()
        ServedAdapter.objects.filter(pk=row.pk).update(
            placement={**row.placement, "replicas": [other.pk]}
        )
        reconcile_deployment(deployment.pk, "beat")  # loaded on the other; both serve
        assert requests.post(url, json=body, timeout=10).status_code == 200
        reconcile_deployment(deployment.pk, "beat")  # drained at the front door, unloaded
        assert requests.post(url, json=body, timeout=10).status_code == 200
    old = next(r for r in fleet.replicas if r.base_url == Replica.objects.get(pk=home).base_url)
    assert name not in old.adapters
    drains = HttpAttempt.objects.filter(
        purpose="gateway", replica_id=home, url__contains=f"m_{name}/r{home} state drain"
    )
    assert drains.exists(), list(HttpAttempt.objects.filter(purpose="gateway").values("url"))
    unload = HttpAttempt.objects.filter(replica_id=home, purpose="unload").latest("started_at")
    assert drains.latest("started_at").started_at <= unload.started_at


def test_a_rollout_moves_the_placement_off_a_replica_that_is_down(
    root, lena, fleet, tmp_path, contracts, approved_v1, approved_v2
):
    deployment = make_deployment(root, fleet.urls, tmp_path / "volume", name="moving")
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, max_replicas=1)
    assert rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w") == "succeeded"
    [home] = _holders(fleet, "legal-contracts")
    fleet.replicas[home].unavailable = 10**6
    Replica.objects.filter(base_url=fleet.replicas[home].base_url).update(health="down")

    _, swap = promote(lena, deployment, approved_v2)
    assert rollout_execute(swap.pk, "w") == "succeeded"

    holders = [i for i in _holders(fleet, "legal-contracts") if i != home]
    assert len(holders) == 1
    served = ServedAdapter.objects.get(deployment=deployment)
    new_home = fleet.replicas[holders[0]]
    assert new_home.adapters["legal-contracts"] == served.served_path


@contextlib.contextmanager
def _v1_behind_a_front_door(name, max_replicas, *, root, lena, fleet, tmp_path, settings, v1):
    """legal-contracts v1 served on the fleet (on `max_replicas` of its replicas;
    None: every one) and routed through a real HAProxy: (deployment, its URL)."""
    from serving.door.selectors import routing_table_for
    from serving.door.services import front_door_for

    deployment = make_deployment(root, fleet.urls, tmp_path / "volume", name=name)
    ServedAdapter.objects.create(
        deployment=deployment, adapter=v1.adapter, max_replicas=max_replicas
    )
    listen = f"127.0.0.1:{free_port()}"
    settings.SERVING_DOORS = {deployment.name: listen}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    settings.SERVING_DOOR_DRAIN_SECONDS = 5.0
    # Open (no keys): these tests are about routing; keys: test_door_haproxy.py.
    deployment.open_door = True
    deployment.save(update_fields=["open_door"])
    door = front_door_for(deployment)
    door.write(routing_table_for(deployment))
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        assert rollout_execute(promote(lena, deployment, v1)[1].pk, "w") == "succeeded"
        yield deployment, f"http://{listen}/v1/completions"


@pytest.fixture
def behind_a_front_door(root, lena, fleet, tmp_path, settings, approved_v1):
    """legal-contracts on ONE of the 3 replicas (max_replicas 1)."""
    with _v1_behind_a_front_door(
        "spare", 1, root=root, lena=lena, fleet=fleet, tmp_path=tmp_path, settings=settings,
        v1=approved_v1,
    ) as served:  # fmt: skip
        yield served


def _ask(url):
    body = {"model": "legal-contracts", "prompt": "hi", "max_tokens": 1}
    return requests.post(url, json=body, timeout=10).status_code


def _server_changes(since):
    from serving.models import HttpAttempt

    rows = HttpAttempt.objects.filter(purpose="gateway", started_at__gte=since).order_by(
        "started_at", "id"
    )
    return [(row.replica_id, row.url.split(" state ")[-1]) for row in rows if " state " in row.url]


def test_a_swap_of_an_adapter_on_one_replica_is_made_on_another_first(
    behind_a_front_door, fleet, lena, approved_v1, approved_v2, settings
):
    deployment, url = behind_a_front_door
    [home] = _holders(fleet, "legal-contracts")
    old_path = fleet.replicas[home].adapters["legal-contracts"]
    assert _ask(url) == 200

    _, swap = promote(lena, deployment, approved_v2)
    assert rollout_execute(swap.pk, "w") == "succeeded"
    swap.refresh_from_db()

    # The new version went to another replica, which took the traffic before the
    # old one was drained; the old one keeps v1 loaded (a rollback's switch).
    holders = _holders(fleet, "legal-contracts")
    [spare] = [i for i in holders if i != home]
    assert fleet.replicas[spare].adapters["legal-contracts"] == swap.served_path
    assert fleet.replicas[home].adapters["legal-contracts"] == old_path
    by_url = {r.base_url: r.pk for r in Replica.objects.filter(deployment=deployment)}
    spare_id, home_id = (
        by_url[fleet.replicas[spare].base_url],
        by_url[fleet.replicas[home].base_url],
    )
    # (maint: the rollout's last sync; the routing table serves v2 only.)
    assert _server_changes(swap.started_at) == [
        (spare_id, "ready"),
        (home_id, "drain"),
        (home_id, "maint"),
    ]
    row = ServedAdapter.objects.get(deployment=deployment)
    assert State.from_dict(row.placement).replicas == (spare_id,)
    assert _ask(url) == 200

    # The reconcile keeps the drained copy for SERVING_ROLLBACK_RETAIN_SECONDS...
    reconcile_deployment(deployment.pk, "beat")
    assert fleet.replicas[home].adapters.get("legal-contracts") == old_path

    # ...and a rollback meanwhile is a switch back to it, not a reload.
    from serving.services.promotions import rollback_to
    from tests.conftest import actor

    seen = len(fleet.replicas[home].requests)
    back = rollback_to(
        actor=actor(lena), deployment=deployment, adapter=row.adapter, version=approved_v1
    )
    assert rollout_execute(back.pk, "w") == "succeeded"
    back.refresh_from_db()
    assert _server_changes(back.started_at) == [
        (home_id, "ready"),
        (spare_id, "drain"),
        (spare_id, "maint"),
    ]
    assert fleet.replicas[home].adapters["legal-contracts"] == old_path
    # Asked to load what it already had (vLLM answers "already loaded"), never
    # to unload it: no reload.
    paths = [path for _, path, _ in fleet.replicas[home].requests[seen:]]
    assert "/v1/unload_lora_adapter" not in paths, paths
    assert paths.count("/v1/load_lora_adapter") <= 1, paths
    assert State.from_dict(ServedAdapter.objects.get(pk=row.pk).placement).replicas == (home_id,)
    assert _ask(url) == 200

    # Once the retention is over, the copy the rollback left is unloaded.
    kept = ServedAdapter.objects.get(pk=row.pk).kept_copy
    assert kept["replicas"] == [spare_id]  # what the rollback left
    ServedAdapter.objects.filter(pk=row.pk).update(kept_copy={**kept, "until": 0})
    reconcile_deployment(deployment.pk, "beat")
    assert _holders(fleet, "legal-contracts") == [home]
    assert _ask(url) == 200


def test_a_swap_made_on_a_spare_that_fails_verification_never_stops_the_old_version(
    behind_a_front_door, fleet, lena, approved_v2
):
    deployment, url = behind_a_front_door
    [home] = _holders(fleet, "legal-contracts")
    old_path = fleet.replicas[home].adapters["legal-contracts"]
    for i, replica in enumerate(fleet.replicas):
        if i != home:
            replica.no_effect.add("legal-contracts")  # the new version looks like the base

    _, swap = promote(lena, deployment, approved_v2)
    assert rollout_execute(swap.pk, "w") == "rolled_back"
    swap.refresh_from_db()

    assert "never stopped serving" in swap.error, swap.error
    assert _holders(fleet, "legal-contracts") == [home]
    assert fleet.replicas[home].adapters["legal-contracts"] == old_path
    home_id = Replica.objects.get(base_url=fleet.replicas[home].base_url).pk
    # The old replica was never drained: no change of its state at the front door.
    assert all(replica != home_id for replica, _ in _server_changes(swap.started_at))
    assert _ask(url) == 200


def _state_of(user, deployment, replica_id: int) -> tuple[str, bool]:
    """(state, in_sync) of legal-contracts on the replica, as the state API shows it."""
    from serving.selectors import deployment_state
    from tests.conftest import actor

    url = Replica.objects.get(pk=replica_id).base_url
    [replica] = [
        r for r in deployment_state(actor(user), deployment)["replicas"] if r["base_url"] == url
    ]
    [row] = [a for a in replica["adapters"] if a["served_name"] == "legal-contracts"]
    return row["state"], row["in_sync"]


def test_a_swap_on_every_replica_keeps_the_old_version_on_the_last_until_its_time_is_up(
    root, lena, fleet, tmp_path, settings, approved_v1, approved_v2
):
    from observability.collector import ControlPlaneCollector
    from serving.models import ReplicaRollout, ReplicaStepStatus

    with _v1_behind_a_front_door(
        "keep", None, root=root, lena=lena, fleet=fleet, tmp_path=tmp_path, settings=settings,
        v1=approved_v1,
    ) as (deployment, url):  # fmt: skip
        old_path = fleet.replicas[0].adapters["legal-contracts"]
        _, swap = promote(lena, deployment, approved_v2)
        assert rollout_execute(swap.pk, "w") == "succeeded"
        swap.refresh_from_db()

        roots = [r.adapters["legal-contracts"] for r in fleet.replicas]
        assert sorted(roots) == sorted([swap.served_path] * 2 + [old_path])
        [kept] = [i for i, root in enumerate(roots) if root == old_path]
        kept_id = Replica.objects.get(base_url=fleet.replicas[kept].base_url).pk
        step = ReplicaRollout.objects.get(rollout=swap, replica_id=kept_id)
        assert step.status == ReplicaStepStatus.DEFERRED and "rollback" in step.error
        assert _ask(url) == 200

        # Kept while its time runs, and not counted as missing meanwhile...
        reconcile_deployment(deployment.pk, "beat")
        assert fleet.replicas[kept].adapters["legal-contracts"] == old_path
        missing = {
            tuple(sample.labels.values()): sample.value
            for family in ControlPlaneCollector().collect()
            if family.name == "lora_adapters_missing"
            for sample in family.samples
        }
        assert set(missing.values()) == {0}, missing
        assert _state_of(root, deployment, kept_id) == ("kept", True)

        # ...then swapped by the reconcile, and its step done.
        ServedAdapter.objects.filter(deployment=deployment).update(
            kept_copy={**ServedAdapter.objects.get(deployment=deployment).kept_copy, "until": 0}
        )
        reconcile_deployment(deployment.pk, "beat")
        assert fleet.replicas[kept].adapters["legal-contracts"] == swap.served_path
        step.refresh_from_db()
        assert step.status == ReplicaStepStatus.SUCCEEDED, step.error
        assert _state_of(root, deployment, kept_id) == ("in_sync", True)
        assert _ask(url) == 200


def test_the_verification_of_a_placed_copy_is_marked_as_the_control_planes_own(placed, fleet):
    from serving.models import OwnProbe

    deployment, served = placed
    reconcile_deployment(deployment.pk, "beat")
    by_url = {r.pk: r.base_url for r in Replica.objects.filter(deployment=deployment)}
    marked = {(by_url[p.replica_id], p.served_name) for p in OwnProbe.objects.all()}
    placed_copies = {
        (fleet.replicas[i].base_url, s.adapter.served_name)
        for s in served
        for i in _holders(fleet, s.adapter.served_name)
    }
    assert placed_copies and placed_copies <= marked
