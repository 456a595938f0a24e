"""Tokens vLLM counted that no span reported (observability.unmetered): each
replica's counters against the spans, settled once every span of a window has
had time to arrive. Readings are built here; tests/serving/vllm/
test_aborted_streams_real.py has a real vLLM and a client that aborts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Sum

from observability.metering import SpanTokens
from observability.models import DailyTokens, MeteringState, UnattributedTokens
from observability.tokens import metered_spans_record
from observability.unmetered import SETTLE_AFTER_SECONDS, unmetered_tokens_reconcile
from serving.lora_metrics import LoraSnapshot
from serving.replica_calls import MetricsReading, ReplicaOutcome
from serving.services.inference_keys import inference_key_issue
from tests.conftest import actor

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def tick(deployment, seconds, *counters, in_flight=0):
    """One reconcile's reading: `counters` is (prompt, generation) per replica."""
    replicas = list(deployment.replicas.order_by("pk"))
    readings = {
        replica.pk: MetricsReading(
            ReplicaOutcome().succeed(),
            LoraSnapshot(
                prompt_tokens_total=prompt,
                generation_tokens_total=generation,
                requests_in_flight=in_flight,
            ),
            at(seconds),
        )
        for replica, (prompt, generation) in zip(replicas, counters, strict=True)
    }
    return unmetered_tokens_reconcile(deployment, replicas, readings, now=at(seconds))


def span(key, started, finished, prompt, completion) -> SpanTokens:
    return SpanTokens(
        request_id=f"chatcmpl-u1.k{key.pk}.v0.{uuid.uuid4()}",
        finished_at=at(finished),
        prompt_tokens=prompt,
        completion_tokens=completion,
        span_id=uuid.uuid4().hex[:16],
        started_at=at(started),
    )


@pytest.fixture
def deployment(deployment, fake_replicas):
    """The tiny deployment with its two replicas registered."""
    from serving.models import Replica

    for fake in fake_replicas:
        Replica.objects.get_or_create(deployment=deployment, base_url=fake.base_url)
    return deployment


@pytest.fixture
def key(root, finance):
    issued, _ = inference_key_issue(
        actor=actor(root), department=finance, name="batch", expires_in_days=3
    )
    return issued


def unattributed(deployment) -> tuple[int, int]:
    sums = UnattributedTokens.objects.filter(deployment=deployment).aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    return sums["p"] or 0, sums["c"] or 0


def test_a_client_that_aborts_every_stream_is_counted_all_the_same(deployment, key):
    """No span for an aborted stream: what the replicas counted beyond the
    spans is charged to the deployment, to the token, once settled."""
    assert deployment.replicas.count() == 2
    tick(deployment, 0, (1000, 500), (0, 0))  # quiet: the baseline
    # A finished request (its span) and, on the other replica, aborted streams.
    metered_spans_record(deployment, [span(key, 5, 8, 30, 20)])
    tick(deployment, 10, (1030, 520), (400, 90))
    tick(deployment, 40, (1030, 520), (800, 180))
    assert tick(deployment, SETTLE_AFTER_SECONDS - 1, (1030, 520), (800, 180)) == (0, 0)
    assert unattributed(deployment) == (0, 0)  # nothing settled yet
    tick(deployment, SETTLE_AFTER_SECONDS + 45, (1030, 520), (800, 180))
    assert unattributed(deployment) == (800, 180)
    # The finished request is its caller's, and only it.
    row = DailyTokens.objects.get()
    assert (row.key, row.prompt_tokens, row.completion_tokens) == (key, 30, 20)
    # Settled again later with nothing new: charged once.
    tick(deployment, 2 * SETTLE_AFTER_SECONDS + 100, (1030, 520), (800, 180))
    assert unattributed(deployment) == (800, 180)


def test_a_request_in_flight_at_a_reading_is_not_charged_when_its_span_comes(deployment, key):
    tick(deployment, 0, (0, 0), (0, 0))
    # Started at 20, read at 30 with 5 tokens generated, finished at 60 with 40.
    tick(deployment, 30, (10, 5), (0, 0), in_flight=1)
    metered_spans_record(deployment, [span(key, 20, 60, 10, 40)])
    tick(deployment, 90, (10, 40), (0, 0))
    tick(deployment, SETTLE_AFTER_SECONDS + 100, (10, 40), (0, 0))
    assert unattributed(deployment) == (0, 0)
    state = MeteringState.objects.get(deployment=deployment)
    assert (state.deficit_prompt, state.deficit_completion) == (0, 0)


def test_a_span_later_than_the_settling_delay_is_taken_off_the_next_charge(deployment, key):
    tick(deployment, 0, (0, 0), (0, 0))
    tick(deployment, 30, (10, 100), (0, 0), in_flight=1)  # a very long request
    tick(deployment, SETTLE_AFTER_SECONDS + 40, (10, 100), (0, 0), in_flight=1)
    assert unattributed(deployment) == (10, 100)  # no span yet: charged
    metered_spans_record(deployment, [span(key, 20, 700, 10, 300)])  # it ends: late
    tick(deployment, SETTLE_AFTER_SECONDS + 80, (10, 300), (0, 0))
    # Aborted streams next: the late span is taken off them, not charged twice.
    tick(deployment, SETTLE_AFTER_SECONDS + 120, (60, 500), (0, 0))
    tick(deployment, 3 * SETTLE_AFTER_SECONDS, (60, 500), (0, 0))
    # What was aborted: 60 - 10 prompt, 500 - 300 completion tokens. The early
    # charge for the long request is absorbed, not charged again.
    assert unattributed(deployment) == (50, 200)


def test_no_baseline_while_requests_are_in_flight(deployment):
    tick(deployment, 0, (100, 100), (0, 0), in_flight=2)
    assert MeteringState.objects.get(deployment=deployment).settled_at is None
    tick(deployment, 10, (150, 150), (0, 0))
    state = MeteringState.objects.get(deployment=deployment)
    assert state.settled_at == at(10)
    assert (state.counted_prompt, state.counted_completion) == (50, 50)


def test_a_restarted_replica_counts_from_zero(deployment):
    tick(deployment, 0, (500, 500), (0, 0))
    tick(deployment, 10, (20, 10), (0, 0))  # lower: a restart in between
    state = MeteringState.objects.get(deployment=deployment)
    assert (state.counted_prompt, state.counted_completion) == (20, 10)


def test_a_replica_without_counters_changes_nothing(deployment):
    replicas = list(deployment.replicas.all())
    readings = {
        r.pk: MetricsReading(ReplicaOutcome().succeed(), LoraSnapshot(), at(0)) for r in replicas
    }
    assert unmetered_tokens_reconcile(deployment, replicas, readings, now=at(0)) == (0, 0)
    assert not MeteringState.objects.exists()


def test_a_platform_admin_sees_them_and_nobody_s_share_grows_by_them(
    deployment, key, as_root, as_alex
):
    """The usage page and API show the unattributed tokens to a platform admin
    only; in the cost split they count in the deployment's total."""
    from observability.selectors import department_costs
    from serving.models import Deployment

    today = datetime.now(UTC).date()
    now = (datetime.now(UTC) - T0).total_seconds()
    metered_spans_record(deployment, [span(key, now - 5, now - 1, 100, 100)])
    UnattributedTokens.objects.create(
        day=today, deployment=deployment, prompt_tokens=300, completion_tokens=300
    )
    body = as_root.get("/api/v1/usage/").json()
    assert body["unattributed"] == [
        {
            "day": str(today),
            "deployment": deployment.name,
            "prompt_tokens": 300,
            "completion_tokens": 300,
        }
    ]
    assert as_alex.get("/api/v1/usage/").json()["unattributed"] == []
    page = as_root.get("/usage/").content.decode()
    assert 'data-testid="usage-unattributed"' in page
    assert "Tokens no caller can be charged" in page
    Deployment.objects.filter(pk=deployment.pk).update(gpus=1)
    costs = department_costs([key.department], today, today, figures=True)
    (cost,) = [c for c in costs if c.prompt_tokens]
    assert cost.share == pytest.approx(0.25)  # 400 weighted of 1600: the rest is nobody's
