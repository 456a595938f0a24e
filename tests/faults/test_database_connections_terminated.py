"""3. The worker's PostgreSQL connections are terminated mid-rollout, as a
database failover or a connection-pooler restart does. Only the worker's:
its connections carry an application_name of their own."""

from __future__ import annotations

import pytest
from django.db import connection

from serving.models import Rollout
from tests.faults.conftest import WORKER_APP_NAME, answers
from tests.serving.vllm.conftest import ok
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db(transaction=True)

CONVERGE_SECONDS = 60
LOAD = "/v1/load_lora_adapter"


def terminate_worker_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s",
            [WORKER_APP_NAME],
        )
        return cursor.fetchone()[0]


def test_a_rollout_converges_after_the_workers_database_connections_are_killed(
    stack, platform, replicas, proxy_b, measure
):
    m = measure("3. worker's PostgreSQL connections terminated mid-rollout", CONVERGE_SECONDS)
    stack.use_broker("redis")
    stack.start_worker()
    # Beat keeps its own application_name: the fault is the worker's alone.
    stack.extra_env["DATABASE_URL"] = stack.env()["DATABASE_URL"].replace(
        WORKER_APP_NAME, "faults-beat"
    )
    stack.start_beat()
    stack.extra_env.clear()
    a = replicas[0]
    platform.create_deployment("faults", [a.base_url, proxy_b.base_url])
    version = platform.approved_version("contracts", "legal-contracts", AdapterSpec(seed=1))

    proxy_b.fail_paths[LOAD] = 503
    rollout_id = ok(platform.promote("faults", version["id"]), 201)["rollout"]
    retrying = m.converge(
        lambda: sum(path.startswith(LOAD) for _, path in proxy_b.requests) >= 2, timeout=60
    )
    assert retrying is not None, "the rollout never reached B"

    terminated = terminate_worker_connections()
    m.notes["connections_terminated"] = terminated
    assert terminated >= 1, "the worker had no connection to terminate: the fault did not happen"
    proxy_b.fail_paths.clear()
    m.fault_ended()

    def served_everywhere() -> bool:
        return (
            Rollout.objects.get(pk=rollout_id).status == "succeeded"
            and answers(a.base_url, "legal-contracts")
            and answers(proxy_b.base_url, "legal-contracts")
        )

    m.converge(served_everywhere)
    m.settle()
    m.notes["final_status"] = Rollout.objects.get(pk=rollout_id).status
    m.check()
