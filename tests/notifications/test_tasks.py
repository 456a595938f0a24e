"""The app's tasks run where mail and webhooks belong, and beat sweeps."""

from __future__ import annotations

from django.conf import settings

from config.celery import app


def test_the_sweeper_is_on_beats_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["notifications-sweep"]
    assert entry["task"] == "notifications.sweep"
    assert entry["schedule"] <= 30


def test_the_budget_and_sync_checks_run_every_minute():
    for name in ("budgets", "out_of_sync"):
        entry = settings.CELERY_BEAT_SCHEDULE[f"notifications-{name}"]
        assert entry["task"] == f"notifications.{name}"
        assert entry["schedule"] == 60.0


def test_every_notification_task_goes_to_the_housekeeping_queue():
    router = app.amqp.router
    for name in (
        "notifications.fan_out",
        "notifications.send_email",
        "notifications.deliver",
        "notifications.budgets",
        "notifications.out_of_sync",
    ):
        assert app.tasks[name].acks_late
        route = router.route({}, name, args=(1,))
        assert route["queue"].name == "housekeeping", name
