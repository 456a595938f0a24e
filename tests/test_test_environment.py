"""The test run's environment (tests/support/test_environment.py)."""

from __future__ import annotations

import pytest

from tests.support.test_environment import _broker_of_this_worker


@pytest.mark.parametrize(
    ("url", "worker", "expected"),
    [
        ("redis://127.0.0.1:6379/2", "gw0", "redis://127.0.0.1:6379/2"),
        ("redis://127.0.0.1:6379/2", "gw1", "redis://127.0.0.1:6379/3"),
        ("rediss://cache:6380/4", "gw1", "rediss://cache:6380/5"),
        # No database number, or no Redis: left as it is.
        ("redis://127.0.0.1:6379", "gw1", "redis://127.0.0.1:6379"),
        ("sqlite:///var/celery-broker.sqlite3", "gw1", "sqlite:///var/celery-broker.sqlite3"),
    ],
)
def test_each_xdist_worker_gets_its_own_redis_database(url, worker, expected):
    assert _broker_of_this_worker(url, worker) == expected
