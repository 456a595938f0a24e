"""The rollout engine's hold at the front door, on a deployment of ONE stand-in
replica, with a door that records what it is asked (the error paths; the door
itself is real in test_door_hold.py, and both together on real vLLM in
tests/serving/vllm/test_hold_real.py): the hold always ends, after the replica
is back or after the rollback, and a replica still running requests of the
adapter is never swapped under them."""

from __future__ import annotations

import pytest

from serving.door import TakenOut
from serving.models import HttpAttempt, ServedAdapter
from serving.rollouts.engine import rollout_execute
from tests.serving.conftest import make_deployment
from tests.serving.test_rollouts import promote
from tests.support.vllm_standin import serve_standin

pytestmark = pytest.mark.django_db


class RecordingDoor:
    """A FrontDoor that says yes and writes down each call, in order."""

    def __init__(self, busy: int = 0):
        self.busy = busy
        self.calls: list[tuple] = []

    def apply(self, table):
        return []

    def apply_access(self, access):
        return []

    def take_out(self, model, server, *, timeout, hold_seconds, owner, tick=None):
        self.calls.append(("take_out", server))
        if tick is not None:
            tick()  # the engine's claim is renewed while it waits
        return TakenOut(
            [f"add map /door/held.map {model} 1-{owner}"], held=True, owner=owner, busy=self.busy
        )

    def release(self, model, *, owner):
        self.calls.append(("release", owner))
        return [f"del map /door/held.map {model}"]

    def drain(self, model, server, *, timeout, keep_one=True):
        self.calls.append(("drain", server))
        return [f"set server m_{model}/{server} state drain"]

    def ready(self, model, server):
        self.calls.append(("ready", server))
        return [f"set server m_{model}/{server} state ready"]


@pytest.fixture
def replica():
    one = serve_standin()
    yield one
    one.close()


@pytest.fixture
def door(monkeypatch, settings):
    settings.SERVING_DOORS = {"single": "127.0.0.1:1"}  # a door exists
    recording = RecordingDoor()
    monkeypatch.setattr("serving.door.services.front_door_for", lambda deployment: recording)
    return recording


@pytest.fixture
def single(root, lena, replica, tmp_path, approved_v1, door):
    """v1 served on a deployment of one replica (its first load takes nothing out)."""
    deployment = make_deployment(root, [replica.base_url], tmp_path / "volume", name="single")
    assert rollout_execute(promote(lena, deployment, approved_v1)[1].pk, "w") == "succeeded"
    assert door.calls == []
    return deployment


def _owner(door) -> str:
    [(_, owner)] = [call for call in door.calls if call[0] == "release"]
    return owner


def test_a_swap_on_the_only_replica_is_held_at_the_door_until_it_is_back(
    single, lena, approved_v2, door, replica
):
    _, swap = promote(lena, single, approved_v2)
    assert rollout_execute(swap.pk, "w") == "succeeded"
    server = f"r{single.replicas.get().pk}"
    assert door.calls == [("take_out", server), ("ready", server), ("release", _owner(door))]
    assert replica.adapters["legal-contracts"].endswith(f"v2-{approved_v2.sha8}")
    # The hold is recorded as the replica's, like its drains.
    urls = list(HttpAttempt.objects.filter(purpose="gateway").values_list("url", flat=True))
    assert any("add map /door/held.map legal-contracts" in url for url in urls), urls
    assert any("del map /door/held.map legal-contracts" in url for url in urls), urls


def test_a_swap_that_fails_verification_rolls_back_and_only_then_ends_the_hold(
    single, lena, approved_v1, approved_v2, door, replica
):
    replica.no_effect.add("legal-contracts")  # v2 answers like the base model
    _, swap = promote(lena, single, approved_v2)
    assert rollout_execute(swap.pk, "w") == "rolled_back"
    server = f"r{single.replicas.get().pk}"
    # Taken out, the rollback's own drain and ready, and the hold ends last.
    assert door.calls == [
        ("take_out", server),
        ("drain", server),
        ("ready", server),
        ("release", _owner(door)),
    ]
    assert replica.adapters["legal-contracts"].endswith(f"v1-{approved_v1.sha8}")


def test_requests_still_running_on_the_replica_are_never_swapped_under(
    single, lena, approved_v1, approved_v2, door, replica
):
    door.busy = 2  # still in flight when the drain's time was up
    seen = len(replica.requests)
    _, swap = promote(lena, single, approved_v2)
    assert rollout_execute(swap.pk, "w") == "rolled_back"
    swap.refresh_from_db()
    assert "Drain failed" in swap.error and "2 request(s)" in swap.error, swap.error
    # v1 was never unloaded; the rollback found it loaded.
    paths = [path for _, path, _ in replica.requests[seen:]]
    assert "/v1/unload_lora_adapter" not in paths, paths
    assert replica.adapters["legal-contracts"].endswith(f"v1-{approved_v1.sha8}")
    assert door.calls[-1][0] == "release"
    assert ServedAdapter.objects.get(deployment=single).version == approved_v1


def test_a_worker_that_crashes_mid_swap_still_ends_the_hold(
    single, lena, approved_v2, door, monkeypatch
):
    def crash(**kwargs):
        raise RuntimeError("a bug between verify and ready")

    monkeypatch.setattr("serving.rollouts.steps.fingerprints_check_rollout", crash)
    _, swap = promote(lena, single, approved_v2)
    with pytest.raises(RuntimeError):
        rollout_execute(swap.pk, "w")
    swap.refresh_from_db()
    assert swap.status == "failed"
    assert [call[0] for call in door.calls] == ["take_out", "release"]
