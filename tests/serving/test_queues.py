"""Each kind of work has its own queue (config/settings.py CELERY_TASK_ROUTES),
so that a long rollout never starves the reconcile."""

from __future__ import annotations

import pytest

from config.celery import app


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("serving.run_rollout", "rollouts"),
        ("serving.reconcile_all", "reconcile"),
        ("serving.reconcile_deployment", "reconcile"),
        ("serving.sweep", "reconcile"),
        ("serving.housekeeping", "housekeeping"),
        ("registry.mlflow.sync_version", "housekeeping"),
        ("registry.mlflow.catch_up", "housekeeping"),
        # The MLflow app's own name since it moved out of registry/.
        ("mlflow_bridge.sync_version", "housekeeping"),
        ("mlflow_bridge.catch_up", "housekeeping"),
        ("sso.check_identities", "housekeeping"),
        ("registry.something_else", "celery"),
    ],
)
def test_tasks_are_routed_to_their_queue(task, queue):
    assert app.amqp.router.route({}, task)["queue"].name == queue


def test_a_worker_without_dash_q_consumes_every_queue():
    assert set(app.amqp.queues) == {"rollouts", "reconcile", "housekeeping", "celery"}


def test_beat_runs_the_sweeper_every_few_seconds(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["serving-sweep"]
    assert entry["task"] == "serving.sweep"
    assert entry["schedule"] <= 10


def test_beat_checks_sso_people_a_few_times_per_interval(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["sso-check-identities"]
    assert entry["task"] == "sso.check_identities"
    assert entry["schedule"] == max(60.0, settings.OIDC_CHECK_INTERVAL_SECONDS / 4)
