"""Races on PostgreSQL: version numbering, double approval, idempotent retries.

Each thread talks to the database over its own connection (Django gives every
thread one) and closes it when done, so the test database can be dropped.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection

from core.models import AuditEvent
from registry.models import AdapterVersion, VersionStatus
from tests.conftest import client_for, requires_postgres
from tests.factories import archive_upload, make_adapter, make_version
from tests.support.adapters import AdapterSpec

pytestmark = [
    pytest.mark.postgres,
    requires_postgres(),
    pytest.mark.django_db(transaction=True),
]


def race(*calls):
    """Run the calls at the same moment, one thread each; return their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)
    errors: list = []

    def run(index, call):
        try:
            barrier.wait(timeout=30)
            results[index] = call()
        except BaseException as error:  # reported in the main thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


def post_version(client, adapter, upload, **headers):
    return lambda: client.post(
        f"/api/v1/adapters/{adapter.pk}/versions/",
        {"files": [upload]},
        format="multipart",
        **headers,
    )


def test_concurrent_registrations_get_numbers_one_to_eight(lena, legal):
    adapter = make_adapter(lena, legal)
    client = client_for(lena)
    uploads = [archive_upload(AdapterSpec(seed=100 + i)) for i in range(8)]

    responses = race(*(post_version(client, adapter, u) for u in uploads))

    assert [r.status_code for r in responses] == [201] * 8, [r.json() for r in responses]
    assert sorted(r.json()["number"] for r in responses) == list(range(1, 9))
    numbers = sorted(
        AdapterVersion.objects.filter(adapter=adapter).values_list("number", flat=True)
    )
    assert numbers == list(range(1, 9))
    adapter.refresh_from_db()
    assert adapter.last_version_number == 8


def test_two_approvers_at_once_make_exactly_one_transition(lena, alex, paula, legal):
    adapter = make_adapter(lena, legal)
    version = make_version(lena, adapter)
    client_for(lena).post(f"/api/v1/versions/{version.pk}/submit/")
    url = f"/api/v1/versions/{version.pk}/approve/"
    as_alex, as_paula = client_for(alex), client_for(paula)

    responses = race(lambda: as_alex.post(url), lambda: as_paula.post(url))

    assert sorted(r.status_code for r in responses) == [200, 409]
    loser = next(r for r in responses if r.status_code == 409).json()["error"]
    assert loser["code"] == "invalid_transition"
    assert "approved" in loser["message"]
    version.refresh_from_db()
    assert version.status == VersionStatus.APPROVED
    assert (
        AuditEvent.objects.filter(action="version.approve", object_id=str(version.pk)).count() == 1
    )


def test_same_idempotency_key_raced_makes_one_version(lena, legal):
    adapter = make_adapter(lena, legal)
    client = client_for(lena)
    spec = AdapterSpec(seed=7)
    calls = [
        post_version(client, adapter, archive_upload(spec), HTTP_IDEMPOTENCY_KEY="run-42")
        for _ in range(4)
    ]

    responses = race(*calls)

    statuses = Counter(r.status_code for r in responses)
    assert statuses[201] == 1, [r.json() for r in responses]
    # Every retry answers with the one version, never a second one or an error.
    assert statuses[200] == 3, [r.json() for r in responses]
    assert {r.json()["number"] for r in responses} == {1}
    assert AdapterVersion.objects.filter(adapter=adapter).count() == 1
    adapter.refresh_from_db()
    assert adapter.last_version_number == 1


def test_same_mlflow_run_raced_with_different_files_makes_one_version(lena, legal):
    adapter = make_adapter(lena, legal)
    client = client_for(lena)

    def call(seed):
        return lambda: client.post(
            f"/api/v1/adapters/{adapter.pk}/versions/",
            {"files": [archive_upload(AdapterSpec(seed=seed))], "mlflow_run_id": "abc123"},
            format="multipart",
        )

    responses = race(call(1), call(2), call(3))

    assert sorted(r.status_code for r in responses) == [200, 200, 201]
    assert AdapterVersion.objects.filter(adapter=adapter).count() == 1
