"""7. A slow and lossy network to one replica: every request to it waits, and
every third one is dropped without an answer. The rollout succeeds or fails
cleanly within its deadline, and every attempt the replica saw is recorded."""

from __future__ import annotations

import pytest

from serving.models import HttpAttempt, Rollout
from serving.rules.transitions import ROLLOUT_TERMINAL
from tests.faults.conftest import answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

# The worker's retry deadline (FAST) plus room for the slow requests themselves.
DEADLINE_SECONDS = 120 + 30


def test_a_rollout_over_a_slow_lossy_link_ends_within_its_deadline_with_every_attempt_recorded(
    stack, platform, replicas, proxy_b, measure
):
    m = measure("7. slow (0.4 s) and lossy (1 in 3 dropped) link to one replica", DEADLINE_SECONDS)
    stack.use_broker("redis")
    stack.start_worker()  # no beat: every request B sees is the rollout's
    a = replicas[0]
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=7))

    proxy_b.latency_seconds = 0.4
    proxy_b.drop_every = 3
    rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]
    m.fault_ended()  # the fault lasts the whole rollout: the figure is its duration
    m.converge(lambda: Rollout.objects.get(pk=rollout_id).status in ROLLOUT_TERMINAL)
    m.settle()
    rollout = Rollout.objects.get(pk=rollout_id)
    seen = list(proxy_b.requests)
    recorded = HttpAttempt.objects.filter(replica__base_url=proxy_b.base_url)
    m.notes.update(
        final_status=rollout.status,
        requests_seen_by_b=len(seen),
        dropped=proxy_b.dropped,
        attempts_recorded_for_b=recorded.count(),
    )
    m.check()
    assert proxy_b.dropped >= 1, "no request was dropped: the fault did not happen"
    assert recorded.count() == len(seen), (recorded.count(), seen)
    assert recorded.filter(status_code__isnull=True, transient=True).count() == proxy_b.dropped
    if rollout.status == "succeeded":
        proxy_b.latency_seconds, proxy_b.drop_every = 0, 0
        assert answers(a.base_url, "legal-contracts")
        assert answers(proxy_b.base_url, "legal-contracts")
    else:
        assert rollout.error, "a rollout that did not succeed must say why"
