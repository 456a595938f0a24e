"""Reconcile at fleet scale, against the vLLM stand-in (many replicas in one
process): what an in-sync tick costs, what it writes, how drift is counted,
how repairs run in parallel, and how staged folders are trusted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone

from observability.models import ReplicaLoraState
from serving.models import DriftEvent, HttpAttempt, Replica, ServedAdapter, StagedFolder
from serving.reconcile.tick import reconcile_deployment
from serving.volume import StagingError, stage_version, stage_versions
from tests.serving.conftest import make_deployment
from tests.support.fleet import (
    fingerprints_record,
    measure,
    served_adapters_clone,
    standin_fleet,
    standin_load,
)

pytestmark = pytest.mark.django_db

# The target for an in-sync tick, whatever the adapters and replicas.
MAX_STATEMENTS = 10


@pytest.fixture
def fleet():
    with standin_fleet(3) as fleet:
        # Idle /metrics, as if nobody sent requests. The tick's own fingerprint
        # probes are requests too, and vLLM (and so the stand-in) lists them in
        # vllm:lora_requests_info: what observability then writes about them is
        # not the reconcile's cost these statement counts are about.
        for replica in fleet.replicas:
            replica.metrics_text = (
                "# TYPE vllm:lora_requests_info gauge\n"
                'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
                'waiting_lora_adapters=""} 1.0\n'
            )
        yield fleet


@pytest.fixture
def fleet_deployment(root, fleet, tmp_path):
    return make_deployment(root, fleet.urls, tmp_path / "volume", name="fleet")


def _serve(deployment, fleet, version, count, prefix):
    served = served_adapters_clone(deployment, version, count, prefix=prefix)
    for replica in fleet.replicas:
        standin_load(replica, served)
    fingerprints_record(deployment, served)
    return served


def test_an_in_sync_tick_costs_the_same_statements_for_5_and_50_adapters(
    fleet_deployment, fleet, approved_v1
):
    _serve(fleet_deployment, fleet, approved_v1, 5, "few")
    reconcile_deployment(fleet_deployment.pk, "beat")  # first sight: health, versions
    few = measure(lambda: reconcile_deployment(fleet_deployment.pk, "beat"))
    assert few.result.in_sync == 3 and few.result.repairs == []

    _serve(fleet_deployment, fleet, approved_v1, 45, "more")
    reconcile_deployment(fleet_deployment.pk, "beat")  # the listings changed: written once
    many = measure(lambda: reconcile_deployment(fleet_deployment.pk, "beat"))
    assert many.result.in_sync == 3 and many.result.repairs == []

    assert few.statements == many.statements, (few.sql, many.sql)
    assert many.statements <= MAX_STATEMENTS, many.sql


def test_a_tick_reads_each_replicas_metrics_once(fleet_deployment, fleet, approved_v1, settings):
    # The observe step's read serves the weight check, the reported max_lora,
    # observability's activity and placement's demand: nobody reads it again.
    settings.SERVING_FINGERPRINT_SAMPLE = 5  # every adapter probed every tick
    _serve(fleet_deployment, fleet, approved_v1, 5, "once")
    for ticks in range(1, 4):  # first sight, the listings written, then in sync
        before = [replica.calls.get("metrics", 0) for replica in fleet.replicas]
        report = reconcile_deployment(fleet_deployment.pk, "beat")
        after = [replica.calls.get("metrics", 0) for replica in fleet.replicas]
        assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1], ticks
    assert report.in_sync == 3 and all(len(names) == 5 for names in report.probed.values())
    assert {r.reported_facts.get("max_lora") for r in Replica.objects.all()} == {2}
    assert ReplicaLoraState.objects.filter(ok=True, ok_reads=3).count() == 3


def test_nothing_is_written_when_nothing_changed(fleet_deployment, fleet, approved_v1):
    _serve(fleet_deployment, fleet, approved_v1, 20, "quiet")
    reconcile_deployment(fleet_deployment.pk, "beat")
    before = {
        "attempts": HttpAttempt.objects.count(),
        "drift": DriftEvent.objects.count(),
        "states": ReplicaLoraState.objects.count(),
        "listings": {r.pk: r.loaded_adapters for r in Replica.objects.all()},
        "folders": list(StagedFolder.objects.values_list("pk", "verified_at")),
    }

    for replica in fleet.replicas:  # as after a restart and reloads in another order
        replica.adapters = dict(reversed(list(replica.adapters.items())))
    tick = measure(lambda: reconcile_deployment(fleet_deployment.pk, "beat"))
    reconcile_deployment(fleet_deployment.pk, "beat")

    assert not [s for s in tick.sql if s.upper().startswith("INSERT")], tick.sql
    assert HttpAttempt.objects.count() == before["attempts"]
    assert DriftEvent.objects.count() == before["drift"]
    assert ReplicaLoraState.objects.count() == before["states"]
    assert {r.pk: r.loaded_adapters for r in Replica.objects.all()} == before["listings"]
    assert list(StagedFolder.objects.values_list("pk", "verified_at")) == before["folders"]
    # The polls are counted instead, on the replicas.
    assert sorted(Replica.objects.values_list("in_sync_polls", flat=True)) == [2, 2, 2]
    assert all(r.in_sync_since for r in Replica.objects.all())


def test_a_repeating_failure_is_one_event_with_a_count(fleet_deployment, fleet, approved_v1):
    served = _serve(fleet_deployment, fleet, approved_v1, 3, "rank")
    broken = fleet.replicas[0]
    broken.restart()
    broken.max_lora_rank = 1  # every reload of the adapters now fails with a 500
    for tick in range(1, 4):
        reconcile_deployment(fleet_deployment.pk, "beat")
        failed = DriftEvent.objects.filter(kind="repair_failed")
        assert failed.count() == 3  # one per adapter, however many ticks
        assert sorted(failed.values_list("count", flat=True)) == [tick] * 3
    event = failed.get(adapter_name=served[0].adapter.served_name)
    assert event.last_seen_at > event.created_at
    assert "rank" in event.detail

    broken.max_lora_rank = 16
    reconcile_deployment(fleet_deployment.pk, "beat")
    assert DriftEvent.objects.filter(kind="missing_reloaded").count() == 3
    assert DriftEvent.objects.filter(kind="repair_failed").count() == 3


def test_a_replica_down_for_several_ticks_is_one_event(fleet_deployment, fleet, approved_v1):
    from tests.support.vllm_standin import serve_standin

    _serve(fleet_deployment, fleet, approved_v1, 2, "down")
    dead = serve_standin()
    url = dead.base_url
    dead.close()
    fleet_deployment.replica_urls = [*fleet.urls, url]
    fleet_deployment.save()
    reconcile_deployment(fleet_deployment.pk, "beat")
    first = HttpAttempt.objects.filter(replica__base_url=url).count()
    assert first >= 1  # its first failed poll is stored
    reconcile_deployment(fleet_deployment.pk, "beat")
    reconcile_deployment(fleet_deployment.pk, "beat")
    down = DriftEvent.objects.get(kind="replica_down")
    assert down.count == 3 and down.replica.base_url == url
    # The repeats are the event's count, not more rows.
    assert HttpAttempt.objects.filter(replica__base_url=url).count() == first


def test_repairs_run_in_parallel_within_the_bounds(
    settings, fleet_deployment, fleet, approved_v1, monkeypatch
):
    import serving.reconcile.repairs as reconcile

    settings.SERVING_RECONCILE_CONCURRENCY = 4
    settings.SERVING_RECONCILE_PER_REPLICA = 2
    _serve(fleet_deployment, fleet, approved_v1, 8, "par")
    reconcile_deployment(fleet_deployment.pk, "beat")
    for replica in fleet.replicas:
        replica.restart()

    lock = threading.Lock()
    running = {"all": 0, "peak": 0}
    per_replica: dict[str, list[int]] = {}
    real = reconcile.ensure_loaded

    def slow_load(client, name, path, policy, **kwargs):
        with lock:
            running["all"] += 1
            running["peak"] = max(running["peak"], running["all"])
            now, peak = per_replica.setdefault(client.base_url, [0, 0])
            per_replica[client.base_url] = [now + 1, max(peak, now + 1)]
        time.sleep(0.05)
        try:
            return real(client, name, path, policy, **kwargs)
        finally:
            with lock:
                running["all"] -= 1
                per_replica[client.base_url][0] -= 1

    monkeypatch.setattr(reconcile, "ensure_loaded", slow_load)
    report = reconcile_deployment(fleet_deployment.pk, "beat")

    assert len(report.repairs) == 24
    assert all(len(r.adapters) == 8 for r in fleet.replicas)
    assert running["peak"] == 4  # parallel, and never beyond the bound
    assert max(peak for _, peak in per_replica.values()) == 2
    # Every repair leaves its adapter's claim free again.
    assert not ServedAdapter.objects.exclude(lease_owner="").exists()


def test_a_verified_folder_is_not_hashed_again(settings, deployment, approved_v1, monkeypatch):
    import serving.volume as volume

    folder = stage_version(deployment, approved_v1)
    assert folder.verified_at is not None and folder.verified_stat
    hashed = []
    real = volume._sha256
    monkeypatch.setattr(volume, "_sha256", lambda path: hashed.append(path) or real(path))

    stage_version(deployment, approved_v1)
    assert hashed == []

    settings.SERVING_STAGED_REVERIFY_SECONDS = 0  # the slow schedule is due
    stage_version(deployment, approved_v1)
    assert len(hashed) == len(approved_v1.files)
    assert StagedFolder.objects.get().verified_at > folder.verified_at


def test_a_tampered_file_is_hashed_again_and_refused(deployment, approved_v1, monkeypatch):
    import serving.volume as volume

    path = Path(stage_version(deployment, approved_v1).write_path)
    hashed = []
    real = volume._sha256
    monkeypatch.setattr(volume, "_sha256", lambda p: hashed.append(p) or real(p))
    target = path / "adapter_model.safetensors"
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))

    result = stage_versions(deployment, [approved_v1])[approved_v1.pk]
    assert hashed, "the changed mtime must trigger a re-hash"
    assert isinstance(result, StagingError) and "does not match" in str(result)


def test_a_repair_reports_a_tampered_folder(fleet_deployment, fleet, approved_v1):
    served = _serve(fleet_deployment, fleet, approved_v1, 2, "tamper")
    reconcile_deployment(fleet_deployment.pk, "beat")
    target = Path(StagedFolder.objects.get(version=served[0].version).write_path)
    weights = target / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    fleet.replicas[0].restart()

    reconcile_deployment(fleet_deployment.pk, "beat")

    failed = DriftEvent.objects.get(kind="repair_failed")
    assert failed.adapter_name == served[0].adapter.served_name
    assert "does not match" in failed.detail
    assert fleet.replicas[0].adapters == {served[1].adapter.served_name: served[1].served_path}


@pytest.mark.django_db(transaction=True)
def test_claims_stay_held_through_repairs_longer_than_a_claim(
    settings, root, fleet, tmp_path, lena, alex, monkeypatch
):
    """Loads that take longer in all than SERVING_CLAIM_SECONDS: the deployment's
    and the adapters' claims are renewed meanwhile, never left to expire."""
    from django.db import connection

    import serving.reconcile.repairs as reconcile
    from registry.models import Department
    from serving.models import Deployment
    from tests.factories import make_adapter, make_approved_version
    from tests.support.adapters import AdapterSpec

    # A 3 s claim, renewed every second, and 4.8 s of loads: a 1 s claim lapsed
    # while the light run (niced beside vLLM) waited for the CPU, renewed late by
    # a starved heartbeat that was not stuck.
    settings.SERVING_CLAIM_SECONDS = 3.0
    settings.SERVING_RECONCILE_PER_REPLICA = 1
    legal = Department.objects.get(slug="legal")
    version = make_approved_version(lena, alex, make_adapter(lena, legal), AdapterSpec(seed=3))
    deployment = make_deployment(root, fleet.urls[:1], tmp_path / "volume", name="long")
    _serve(deployment, fleet, version, 6, "long")
    fleet.replicas[0].restart()
    expired = []
    real = reconcile.ensure_loaded

    def slow_load(client, name, path, policy, **kwargs):
        time.sleep(0.8)
        # Another thread, another connection: it sees only committed claims.
        now = timezone.now()
        row = Deployment.objects.get(pk=deployment.pk)
        if row.reconcile_lease_until is None or row.reconcile_lease_until < now:
            expired.append(("deployment", name))
        if ServedAdapter.objects.filter(adapter__served_name=name, lease_until__lt=now).exists():
            expired.append(("adapter", name))
        connection.close()
        return real(client, name, path, policy, **kwargs)

    monkeypatch.setattr(reconcile, "ensure_loaded", slow_load)
    report = reconcile_deployment(deployment.pk, "beat")
    assert not report.skipped and len(report.repairs) == 6
    assert expired == []


def _client_asks(fleet, replica, name):
    import requests

    answer = requests.post(
        f"{replica.base_url}/v1/completions",
        json={"model": name, "prompt": "hello", "max_tokens": 2},
        timeout=10,
    )
    answer.raise_for_status()


def test_the_ticks_own_probes_are_not_clients_activity_or_demand(root, approved_v1, tmp_path):
    # vLLM (and the stand-in) lists the weight check's probes in /metrics like any
    # request: unpinned here. They must not count as an adapter's use or demand,
    # and the in-sync tick stays within its statements.
    from observability.models import AdapterActivity

    with standin_fleet(3) as live:
        deployment = make_deployment(root, live.urls, tmp_path / "volume", name="live")
        _serve(deployment, live, approved_v1, 5, "probed")
        reconcile_deployment(deployment.pk, "beat")  # reads the set-up's own requests
        AdapterActivity.objects.all().delete()
        for _ in range(3):  # the sample rotates through every adapter
            reconcile_deployment(deployment.pk, "beat")
        tick = measure(lambda: reconcile_deployment(deployment.pk, "beat"))

        assert tick.result.in_sync == 3 and any(tick.result.probed.values()), tick.result
        assert not AdapterActivity.objects.exists()
        assert all(not r.lora_demand for r in Replica.objects.filter(deployment=deployment))
        assert tick.statements <= MAX_STATEMENTS, tick.sql


def test_a_clients_request_before_the_probes_of_its_adapter_is_still_activity(
    root, approved_v1, tmp_path, settings
):
    # The client's request and the probe of the same adapter are ONE series on
    # vLLM, re-stamped by the probe: the read before the probes keeps the client's.
    from observability.models import AdapterActivity

    settings.SERVING_FINGERPRINT_SAMPLE = 50  # every adapter probed every tick
    with standin_fleet(1) as live:
        deployment = make_deployment(root, live.urls, tmp_path / "volume", name="live")
        served = _serve(deployment, live, approved_v1, 3, "asked")
        reconcile_deployment(deployment.pk, "beat")
        AdapterActivity.objects.all().delete()
        reconcile_deployment(deployment.pk, "beat")
        assert not AdapterActivity.objects.exists()  # probes only

        asked = served[1].adapter.served_name
        _client_asks(live, live.replicas[0], asked)
        report = reconcile_deployment(deployment.pk, "beat")

        assert asked in report.probed[deployment.replicas.get().pk]
        assert list(AdapterActivity.objects.values_list("served_name", flat=True)) == [asked]
        assert Replica.objects.get(deployment=deployment).lora_demand == {asked: 1}
