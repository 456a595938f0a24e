"""vLLM forgets everything on restart; Celery beat's reconcile puts it back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from tests.serving.vllm.conftest import adapters_on, chat_through_openai, ok, wait_until
from tests.support.adapters import AdapterSpec

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

INTERVAL = 4.0
# After the beat tick: the broker hop to reconcile_all, then to reconcile_deployment
# (the embedded transport polls every 0.1 s), then the reconcile's own calls.
PICKUP = 6.0


@contextlib.contextmanager
def celery_beat(app, tmp_path, interval: float) -> Iterator[None]:
    """Real Celery beat (threaded, as `celery worker --beat` embeds it) ticking
    the reconcile every `interval` seconds."""
    from celery.beat import EmbeddedService

    saved = app.conf.beat_schedule
    app.conf.beat_schedule = {
        "serving-reconcile": {
            "task": "serving.reconcile_all",
            "schedule": interval,
            "options": {"expires": interval},
        }
    }
    beat = EmbeddedService(app, thread=True, schedule_filename=str(tmp_path / "beat-schedule"))
    beat.start()
    try:
        yield
    finally:
        beat.stop()
        beat.join(timeout=30)
        app.conf.beat_schedule = saved


def test_restarted_replica_gets_its_adapters_back_within_one_interval(
    platform, vllm_servers, celery_worker, settings, tmp_path
):
    from config.celery import app

    settings.SERVING_RECONCILE_INTERVAL_SECONDS = INTERVAL
    urls = [server.base_url for server in vllm_servers]
    platform.create_deployment("staging-cpu", urls)
    expected = {}
    for adapter, served_name, seed in [
        ("contracts", "legal-contracts", 1),
        ("nda", "legal-nda", 2),
    ]:
        version = platform.approved_version(adapter, served_name, AdapterSpec(seed=seed))
        rollout = platform.promote_and_wait("staging-cpu", version["id"])
        assert rollout["status"] == "succeeded", rollout["error"]
        expected[served_name] = rollout["served_path"]
    restarted, untouched = vllm_servers

    def reconciled() -> bool:
        body = ok(platform.admin.get("/api/v1/deployments/staging-cpu/"))  # replicas: admins only
        replicas = {r["base_url"]: r for r in body["replicas"]}
        return bool(body["last_reconciled_at"]) and all(
            r["health"] == "up" and r["last_checked_at"] for r in replicas.values()
        )

    with celery_beat(app, tmp_path, INTERVAL):
        wait_until(lambda: reconciled(), timeout=60, message="first reconcile")

        restarted.kill()  # a crash: no graceful shutdown
        wait_until(
            lambda: _health(platform, restarted.base_url) == "down",
            timeout=INTERVAL + PICKUP + 10,
            message="reconcile sees the replica down",
        )
        restarted.start()
        restarted.wait_ready(timeout=300)
        ready_at = time.monotonic()
        took = wait_until(
            lambda: adapters_on(restarted) == expected,
            timeout=120,
            message="adapters restored on the restarted replica",
        )
        print(f"\n[vllm] adapters back {took:.1f}s after the restarted server was ready")
        assert took <= INTERVAL + PICKUP, f"restored {took:.1f}s after ready"
        assert time.monotonic() - ready_at <= 120

    assert adapters_on(untouched) == expected
    for served_name in expected:
        chat_through_openai(restarted.base_url, served_name)

    # Replica health events name no adapter: platform admins see them.
    # A tick writes its drift in bulk when it ends, after the repairs' HTTP: the
    # adapters can answer a moment before their events are in.
    def drift_on_restarted():
        events = ok(platform.admin.get("/api/v1/deployments/staging-cpu/drift-events/"))["results"]
        kinds = [
            (e["kind"], e["adapter_name"]) for e in events if e["replica"] == restarted.base_url
        ]
        return events, kinds

    wait_until(
        lambda: (
            ("missing_reloaded", "legal-nda") in drift_on_restarted()[1]
            and ("missing_reloaded", "legal-contracts") in drift_on_restarted()[1]
        ),
        timeout=30,
        message="the reloads recorded as drift",
    )
    events, on_restarted = drift_on_restarted()
    assert ("missing_reloaded", "legal-contracts") in on_restarted
    assert ("missing_reloaded", "legal-nda") in on_restarted
    assert ("replica_down", "") in on_restarted
    assert ("replica_up", "") in on_restarted
    reloads = [e for e in events if e["kind"] == "missing_reloaded"]
    assert {e["expected_root"] for e in reloads} == set(expected.values())
    assert not [
        e for e in events if e["replica"] == untouched.base_url and e["kind"] != "unknown_reported"
    ]

    assert _health(platform, restarted.base_url) == "up"
    state = ok(platform.member.get("/api/v1/deployments/staging-cpu/state/"))
    for replica in state["replicas"]:
        assert replica["health"] == "up"
        assert replica["vllm_version"].startswith("0.")
        assert all(adapter["in_sync"] for adapter in replica["adapters"]), replica


def _health(platform, base_url: str) -> str:
    body = ok(platform.admin.get("/api/v1/deployments/staging-cpu/"))  # replicas: admins only
    return next(r["health"] for r in body["replicas"] if r["base_url"] == base_url)
