"""A department at 80 % and at 100 % of a token budget is told once per
budget, window and threshold, from the tokens metering counted (rows written
as metering writes them), to its approvers and its webhooks' audience."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from notifications.models import Event
from notifications.services.budgets import budgets_record
from serving.services.limits import department_limits_set
from tests.conftest import actor
from tests.notifications.conftest import fan_out_all, told
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
_ids = itertools.count()


@pytest.fixture
def metered(root, legal, tmp_path):
    """A metered deployment; returns a function that meters tokens for Legal."""
    from observability.models import MeteredRequest, MeteringState

    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume")
    MeteringState.objects.create(deployment=deployment, last_span_at=NOW)

    def use(tokens: int, at: datetime = NOW - timedelta(minutes=5)) -> None:
        MeteredRequest.objects.create(
            request_id=f"budget-{next(_ids)}",
            deployment=deployment,
            finished_at=at,
            department=legal,
            prompt_tokens=tokens // 2,
            completion_tokens=tokens - tokens // 2,
        )

    return use


@pytest.fixture
def day_budget(root, legal):
    department_limits_set(actor=actor(root), department=legal, changes={"tokens_per_day": 1000})


def test_80_percent_of_the_day_tells_the_approvers_once(
    day_budget, metered, lena, alex, paula, fred
):
    metered(790)
    assert budgets_record(NOW) == 0
    metered(10)
    assert budgets_record(NOW) == 1
    assert budgets_record(NOW) == 0  # told once

    fan_out_all()
    event = Event.objects.get(kind="budget.warning")
    budget = event.payload["data"]["budget"]
    assert budget["limit"] == "tokens_per_day"
    assert (budget["value"], budget["used"], budget["threshold_percent"]) == (1000, 800, 80)
    assert budget["period_start"] == "2026-12-07T00:00:00+00:00"
    assert budget["resets_at"] == "2026-12-08T00:00:00+00:00"
    assert event.department.slug == "legal"
    assert event.link == "/departments/legal/keys/"
    assert told("budget.warning") == {"alex", "paula"}


def test_100_percent_is_told_after_80(day_budget, metered, alex):
    metered(850)
    budgets_record(NOW)
    metered(200)
    assert budgets_record(NOW) == 1
    assert budgets_record(NOW) == 0
    assert Event.objects.filter(kind="budget.exhausted").count() == 1
    assert Event.objects.get(kind="budget.exhausted").payload["data"]["budget"]["used"] == 1050


def test_a_jump_past_100_tells_only_that_it_is_spent(day_budget, metered, alex):
    metered(1200)
    assert budgets_record(NOW) == 1
    assert budgets_record(NOW) == 0
    assert list(Event.objects.values_list("kind", flat=True)) == ["budget.exhausted"]


def test_the_next_day_is_told_again(day_budget, metered, alex):
    metered(900)
    budgets_record(NOW)
    tomorrow = NOW + timedelta(days=1)
    metered(900, at=tomorrow - timedelta(minutes=1))
    assert budgets_record(tomorrow) == 1
    assert Event.objects.filter(kind="budget.warning").count() == 2


def test_yesterdays_tokens_count_for_the_month_not_the_day(root, legal, metered, alex):
    department_limits_set(
        actor=actor(root),
        department=legal,
        changes={"tokens_per_day": 1000, "tokens_per_month": 1100},
    )
    metered(900, at=NOW - timedelta(days=1))
    assert budgets_record(NOW) == 1
    (event,) = Event.objects.all()
    assert event.payload["data"]["budget"]["limit"] == "tokens_per_month"
    assert event.payload["data"]["budget"]["period_start"] == "2026-12-01T00:00:00+00:00"


def test_without_metering_nothing_is_told(day_budget, legal, alex):
    assert budgets_record(NOW) == 0
    assert not Event.objects.exists()
