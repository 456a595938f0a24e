"""Requests and errors per adapter from the front door's cumulative counters:
the arithmetic of a reset, and the daily roll-up written at each reconcile
(with a fake door here; tests/observability/test_usage_through_haproxy.py runs
a real HAProxy)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from observability.models import DailyUsage, FrontDoorReading
from observability.services import reconcile_finished
from observability.usage import counter_increase, counters_increase, front_door_usage_record
from serving.door.haproxy.runtime import BackendCounters
from serving.models import ServedAdapter


def test_a_counter_that_grew_adds_the_difference():
    assert counter_increase(10, 25) == 15


def test_a_counter_read_for_the_first_time_adds_all_it_shows():
    assert counter_increase(None, 7) == 7


def test_a_counter_that_went_down_was_reset_and_adds_its_new_value():
    assert counter_increase(40, 3) == 3
    assert counter_increase(40, 0) == 0


def test_only_names_that_counted_something_are_kept():
    previous = {"a": [5, 1, 0], "b": [9, 0, 2]}
    current = {"a": (5, 1, 0), "b": (2, 0, 1), "c": (4, 4, 0)}
    assert counters_increase(previous, current) == {"b": (2, 0, 1), "c": (4, 4, 0)}


class FakeDoor:
    def __init__(self):
        self.counters: dict[str, BackendCounters] = {}

    def set(self, name, requests, e4=0, e5=0):
        self.counters[name] = BackendCounters(requests, e4, e5)

    def model_counters(self):
        return dict(self.counters)


@pytest.fixture
def door(monkeypatch):
    fake = FakeDoor()
    monkeypatch.setattr("observability.usage.front_door_for", lambda deployment: fake)
    return fake


@pytest.fixture
def served(deployment, approved_v1):
    return ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1, served_path="/v/1"
    )


def today_row(deployment):
    return DailyUsage.objects.get(deployment=deployment)


@pytest.mark.django_db
def test_readings_add_up_across_a_reload(deployment, served, door):
    door.set("legal-contracts", 10, 2, 1)
    assert front_door_usage_record(deployment) == 10
    door.set("legal-contracts", 15, 2, 3)
    assert front_door_usage_record(deployment) == 5
    door.set("legal-contracts", 4, 1, 0)  # HAProxy reloaded: counters began again
    assert front_door_usage_record(deployment) == 4
    row = today_row(deployment)
    assert (row.requests, row.errors_4xx, row.errors_5xx) == (19, 3, 3)
    assert row.department_id == served.adapter.department_id
    assert row.version_id == served.version_id and row.version_number == served.version.number


@pytest.mark.django_db
def test_a_new_version_gets_a_row_of_its_own(deployment, served, approved_v2, door):
    door.set("legal-contracts", 3)
    front_door_usage_record(deployment)
    ServedAdapter.objects.filter(pk=served.pk).update(version=approved_v2)
    door.set("legal-contracts", 8)
    front_door_usage_record(deployment)
    rows = DailyUsage.objects.order_by("version_number").values_list("version_number", "requests")
    assert list(rows) == [(served.version.number, 3), (approved_v2.number, 5)]


@pytest.mark.django_db
def test_an_unchanged_reading_writes_nothing(deployment, served, door):
    door.set("legal-contracts", 3)
    front_door_usage_record(deployment)
    with CaptureQueriesContext(connection) as queries:
        assert front_door_usage_record(deployment) == 0
    assert len(queries) == 1, [q["sql"] for q in queries]  # the one SELECT of the last reading
    door.set("legal-contracts", 4)
    with CaptureQueriesContext(connection) as queries:
        front_door_usage_record(deployment)
    # The reading, served versions, the summing upsert, the reading's update, in
    # one transaction (here a savepoint in the test's), whatever the number of adapters.
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 4, statements
    assert len(queries) == 6


@pytest.mark.django_db
def test_no_front_door_costs_no_statement(deployment, settings):
    settings.SERVING_DOORS = {}
    with CaptureQueriesContext(connection) as queries:
        assert front_door_usage_record(deployment) == 0
    assert len(queries) == 0


@pytest.mark.django_db
def test_a_front_door_that_does_not_answer_is_skipped_until_the_next_tick(
    deployment, served, settings, tmp_path, caplog
):
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:9"}
    settings.SERVING_DOOR_DIR = tmp_path  # no admin.sock: HAProxy is not running
    assert front_door_usage_record(deployment) == 0
    assert f"usage of {deployment.name} not read" in caplog.text
    assert not FrontDoorReading.objects.exists()


@pytest.mark.django_db
def test_a_front_door_that_fails_does_not_fail_the_reconcile(deployment, monkeypatch, caplog):
    def broken(deployment):
        raise OSError("socket gone")

    monkeypatch.setattr("observability.usage.front_door_for", broken)
    reconcile_finished(None, deployment=deployment, seconds=0.1, ok=True, replicas=[])
    assert "front_door_usage_record for" in caplog.text
    assert not FrontDoorReading.objects.exists()
    assert deployment.reconcile_stats.runs == 1
