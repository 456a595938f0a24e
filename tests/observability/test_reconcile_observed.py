"""What each reconcile records: its duration and outcome, and what every up
replica's /metrics said about adapters (the stand-in replicas serve vLLM 0.32's
text, or what a test sets)."""

import time

import pytest
from django.utils import timezone

from observability.models import AdapterActivity, AttemptTally, ReconcileStats, ReplicaLoraState
from serving.models import Deployment, HttpAttempt
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.observability.conftest import lora_info, read_before

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(lena, deployment, approved_v1):
    rollout = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(rollout.rollouts.get().pk, "w") == "succeeded"


def test_a_reconcile_reads_each_replicas_lora_metrics(deployment, served, fake_replicas, contracts):
    now = time.time()
    read_before(deployment, now - 60)
    fake_replicas[0].metrics_text = lora_info(("", "", now - 50), ("legal-contracts", "", now - 5))
    fake_replicas[1].metrics_text = lora_info(("", "", now - 3))

    reconcile_deployment(deployment.pk, "beat")

    first = ReplicaLoraState.objects.get(replica__base_url=fake_replicas[0].base_url)
    assert first.ok and first.running == ["legal-contracts"] and first.max_lora == 2
    assert first.samples == 1 and first.peak_running == 1
    assert first.concurrency == {"0": 1, "1": 1}  # both label sets are news since the last read
    second = ReplicaLoraState.objects.get(replica__base_url=fake_replicas[1].base_url)
    assert second.running == [] and second.concurrency == {"0": 1}
    activity = AdapterActivity.objects.get()
    assert activity.adapter == contracts and activity.active_samples == 1
    assert abs(activity.last_active_at.timestamp() - (now - 5)) < 0.01
    # A successful read is counted on the state, not stored as an attempt row.
    assert (first.ok_reads, second.ok_reads) == (2, 2)
    assert not HttpAttempt.objects.filter(purpose="metrics").exists()


def test_an_unchanged_series_is_not_counted_twice(deployment, served, fake_replicas):
    now = time.time()
    read_before(deployment, now - 60)
    for replica in fake_replicas:
        replica.metrics_text = lora_info(("legal-contracts", "", now - 5))
    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")
    assert AdapterActivity.objects.get().active_samples == 2  # one per replica, not per read

    # A client's request after the ticks' probes of it (their label set is theirs).
    newer = ("legal-contracts", "", time.time())
    fake_replicas[0].metrics_text = lora_info(("legal-contracts", "", now - 5), newer)
    reconcile_deployment(deployment.pk, "beat")
    assert AdapterActivity.objects.get().active_samples == 3


def test_a_request_that_finished_between_two_reads_still_counts(deployment, served, fake_replicas):
    # What vLLM 0.32 exports after a request: its label set, then the idle one.
    now = time.time()
    read_before(deployment, now - 60)
    fake_replicas[0].metrics_text = lora_info(("", "", now - 30))
    fake_replicas[1].metrics_route = False
    reconcile_deployment(deployment.pk, "beat")
    # After the first tick's probes of it: a client's request.
    now = time.time()
    fake_replicas[0].metrics_text = lora_info(
        ("", "", now), ("legal-contracts", "legal-contracts", now - 0.001)
    )
    reconcile_deployment(deployment.pk, "beat")
    activity = AdapterActivity.objects.get()
    assert abs(activity.last_active_at.timestamp() - (now - 0.001)) < 0.01
    assert (activity.active_samples, activity.waiting_samples) == (1, 1)
    state = ReplicaLoraState.objects.get(replica__base_url=fake_replicas[0].base_url)
    assert state.running == [] and state.series_timestamp == now
    # Read again, nothing new: no second count.
    reconcile_deployment(deployment.pk, "beat")
    assert AdapterActivity.objects.get().active_samples == 1


def test_waiting_requests_are_recorded(deployment, served, fake_replicas):
    read_before(deployment, time.time() - 60)
    fake_replicas[0].metrics_text = lora_info(("a,b", "legal-contracts", time.time()))
    fake_replicas[1].metrics_route = False
    reconcile_deployment(deployment.pk, "beat")
    state = ReplicaLoraState.objects.get(replica__base_url=fake_replicas[0].base_url)
    assert state.waiting_samples == 1 and state.peak_running == 2
    activity = AdapterActivity.objects.get(served_name="legal-contracts")
    assert (activity.active_samples, activity.waiting_samples) == (0, 1)


def test_a_replica_without_metrics_is_recorded_as_a_failed_read(deployment, served, fake_replicas):
    for replica in fake_replicas:
        replica.metrics_route = False
    reconcile_deployment(deployment.pk, "beat")
    assert HttpAttempt.objects.filter(purpose="metrics", status_code=404).count() == 2
    assert not ReplicaLoraState.objects.filter(ok=True).exists()
    assert AttemptTally.objects.get(purpose="metrics", status="404").count == 2


def test_duration_and_outcome_are_kept_per_deployment(deployment, served, fake_replicas):
    reconcile_deployment(deployment.pk, "beat")
    reconcile_deployment(deployment.pk, "beat")
    stats = ReconcileStats.objects.get(deployment=deployment)
    assert (stats.runs, stats.failures) == (2, 0)
    assert sum(stats.duration_buckets) == 2 and stats.duration_seconds_sum > 0
    assert stats.last_success_at is not None


def test_tallies_count_each_attempt_once_and_outlive_housekeeping(
    settings, deployment, served, fake_replicas
):
    from tests.observability.test_metrics_endpoint import scrape, value

    settings.METRICS_TOKEN, settings.METRICS_ALLOW_ANONYMOUS = "t", False
    polls = {"deployment": deployment.name, "purpose": "reconcile_models", "status": "200"}
    reads = {**polls, "purpose": "metrics"}
    for replica in fake_replicas:
        replica.metrics_route = False  # until the reads below
    fake_replicas[0].restart()  # a tick with a repair stores its polls as rows
    reconcile_deployment(deployment.pk, "beat")
    assert AttemptTally.objects.get(purpose="reconcile_models", status="200").count == 2
    reconcile_deployment(deployment.pk, "beat")  # in sync: counted on the replicas only
    assert AttemptTally.objects.get(purpose="reconcile_models", status="200").count == 2
    assert value(scrape("t"), "lora_vllm_http_attempts_total", **polls) == 4
    for replica in fake_replicas:
        replica.metrics_route = True
        replica.metrics_text = lora_info(("", "", time.time()))
    reconcile_deployment(deployment.pk, "beat")
    HttpAttempt.objects.filter(replica_rollout__isnull=True).delete()  # what housekeeping prunes
    fake_replicas[1].restart()
    reconcile_deployment(deployment.pk, "beat")
    samples = scrape("t")
    assert value(samples, "lora_vllm_http_attempts_total", **polls) == 8
    assert value(samples, "lora_vllm_http_attempts_total", **reads) == 4


def test_a_failure_to_observe_never_breaks_the_reconcile(
    deployment, served, fake_replicas, monkeypatch
):
    def broken(*args, **kwargs):
        raise RuntimeError("observability is down")

    monkeypatch.setattr("observability.services.vllm_metrics_record", broken)
    fake_replicas[0].restart()  # so the reconcile has a repair to make
    report = reconcile_deployment(deployment.pk, "beat")
    assert len(report.repairs) == 1
    assert Deployment.objects.get(pk=deployment.pk).last_reconciled_at is not None
    assert ReconcileStats.objects.get().runs == 1


def test_a_reconcile_that_raises_is_counted_as_failed_and_still_raises(deployment, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("discovery failed")

    monkeypatch.setattr("serving.reconcile.tick.replicas_sync", broken)
    with pytest.raises(RuntimeError, match="discovery failed"):
        reconcile_deployment(deployment.pk, "beat")
    stats = ReconcileStats.objects.get()
    assert (stats.runs, stats.failures) == (1, 1) and stats.last_success_at is None


def test_a_rollouts_verification_probes_are_not_demand(deployment, served, fake_replicas):
    from serving.models import OwnProbe, Replica

    # The rollout marked its verification on both replicas (serving.records.own_probes).
    assert OwnProbe.objects.filter(served_name="legal-contracts").count() == 2
    marks = {p.replica_id: p.probed_at for p in OwnProbe.objects.all()}
    now = time.time()
    # Read once before the rollout; what vLLM lists now are its probes, running and waiting.
    state_at = now - 60
    ReplicaLoraState.objects.bulk_create(
        ReplicaLoraState(
            replica=r, observed_at=timezone.now(), ok_reads=1, series_timestamp=state_at
        )
        for r in Replica.objects.filter(deployment=deployment)
    )
    for replica in fake_replicas:
        replica.metrics_text = lora_info(
            ("", "", now - 70), ("legal-contracts", "legal-contracts", now)
        )
    reconcile_deployment(deployment.pk, "beat")

    assert [r.lora_demand for r in Replica.objects.filter(deployment=deployment)] == [{}, {}]
    assert not AdapterActivity.objects.exists()
    # Still within the grace: the marks stay for the next read, unchanged.
    assert {p.replica_id: p.probed_at for p in OwnProbe.objects.all()} == marks

    # A client's request after the probes' grace counts.
    later = now + 60
    fake_replicas[0].metrics_text = lora_info(("legal-contracts", "", later))
    reconcile_deployment(deployment.pk, "beat")
    first = Replica.objects.get(base_url=fake_replicas[0].base_url)
    assert first.lora_demand == {"legal-contracts": 1}
    assert AdapterActivity.objects.get().active_samples == 1


def test_a_replicas_first_read_is_a_baseline(deployment, served, fake_replicas):
    from serving.models import Replica

    now = time.time()
    # Older activity vLLM still lists, for an adapter nobody probed.
    for replica in fake_replicas:
        replica.metrics_text = lora_info(("hr-policy", "hr-policy", now - 30), ("", "", now - 20))
    reconcile_deployment(deployment.pk, "beat")
    assert [r.lora_demand for r in Replica.objects.filter(deployment=deployment)] == [{}, {}]
    assert not AdapterActivity.objects.exists()
    state = ReplicaLoraState.objects.get(replica__base_url=fake_replicas[0].base_url)
    assert state.series_timestamp == now - 20 and state.samples == 0 and state.ok_reads == 1

    fake_replicas[0].metrics_text = lora_info(("hr-policy", "", now - 10), ("", "", now - 20))
    reconcile_deployment(deployment.pk, "beat")
    first = Replica.objects.get(base_url=fake_replicas[0].base_url)
    assert first.lora_demand == {"hr-policy": 1}
