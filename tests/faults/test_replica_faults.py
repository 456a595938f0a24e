"""6. A replica is killed (SIGKILL, engine and all) while vLLM is reading the
adapter of a load, and comes back empty: vLLM keeps nothing across a restart.
The rollout in flight must converge once the replica is back, and the
reconcile must load the adapters the replica served before it died (one
restart serves both halves: a vLLM start is the slowest thing in this tier).

"Mid-load" is made sure of, not hoped for: strace holds replica B's opens of
the incoming version's weights (a slow volume, tests/support/slow_reads.py),
the test sees vLLM open them, and only then kills B."""

from __future__ import annotations

import pytest

from registry.models import AdapterVersion
from serving.models import Deployment, DriftEvent, Rollout
from serving.volume import serve_path_for
from tests.faults.conftest import answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec
from tests.support.slow_reads import SlowReads, strace_available

pytestmark = pytest.mark.django_db(transaction=True)

LOAD = "/v1/load_lora_adapter"


def loads_seen(proxy) -> int:
    return sum(path.startswith(LOAD) for _, path in proxy.requests)


def test_a_replica_killed_mid_load_comes_back_with_every_adapter(
    stack, platform, replicas, proxy_b, measure, tmp_path
):
    if not strace_available():
        pytest.skip("scenario 6a holds vLLM inside the read with strace: apt-get install strace")
    killed = measure("6a. replica SIGKILLed mid-load: the rollout converges after", 60)
    restarted = measure("6b. replica restarted empty: reconcile restores its adapters", 60)
    # The rollout must outlast a vLLM start on a busy machine (two minutes, seen here).
    stack.extra_env["SERVING_RETRY_DEADLINE_SECONDS"] = "600"
    stack.use_broker("redis")
    stack.start_worker()
    stack.start_beat()
    a, b = replicas
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    served = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=6))
    incoming = platform.approved_version("leases", "legal-leases", AdapterSpec(seed=16))
    assert platform.promote_and_wait("faults", served["id"])["status"] == "succeeded"

    folder = serve_path_for(
        Deployment.objects.get(name="faults"), AdapterVersion.objects.get(pk=incoming["id"])
    )
    before = loads_seen(proxy_b)
    with SlowReads(b, folder, seconds=30, log=tmp_path / "strace.log") as slow:
        rollout_id = ok(platform.promote("faults", incoming["id"]), 201)["rollout"]
        assert slow.wait_reading(timeout=120), "vLLM on B never started reading the adapter"
        assert loads_seen(proxy_b) > before, "B read the adapter of a load nobody sent it"
        b.kill()
    killed.notes["killed_while_reading_the_adapter"] = True
    b.start_and_wait(timeout=300)
    for m in (killed, restarted):
        m.fault_ended()
        m.notes["replica_start_seconds"] = round(b.last_start_seconds or 0, 1)

    def incoming_served_everywhere() -> bool:
        return (
            Rollout.objects.get(pk=rollout_id).status == "succeeded"
            and answers(a.base_url, "legal-leases")
            and answers(proxy_b.base_url, "legal-leases")
        )

    reloads = DriftEvent.objects.filter(
        replica__base_url=proxy_b.base_url, kind="missing_reloaded", adapter_name="legal-contracts"
    )
    killed.converge(incoming_served_everywhere)
    # Restored means served AND on record: a reconcile tick writes its drift
    # events in bulk at its end, after the fingerprint re-check that follows
    # the repairs, so the adapter answers a moment before its repair is on
    # record (reading the events the moment it answered was this test's flake).
    restarted.converge(lambda: answers(proxy_b.base_url, "legal-contracts") and reloads.exists())
    for m in (killed, restarted):
        m.settle()
    killed.notes["final_status"] = Rollout.objects.get(pk=rollout_id).status
    restarted.notes["reloads_recorded"] = reloads.count()

    killed.check()
    restarted.check()
    assert reloads.count() == 1, "the reload was not recorded as one drift repair"
