"""The worker's side of the outbox: a fan-out happens once whatever the
redeliveries, follows each person's choices, and the sweeper sends again what
a lost task or a dead worker left."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from notifications.models import Channel, EmailStatus, Event, Notification, Preference
from notifications.services.outbox import EVENT_LEASE, event_fan_out
from notifications.tasks import sweep
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_adapter, make_version
from tests.notifications.conftest import fan_out_all, told
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitted(lena, alex, paula, legal):
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    version = make_version(lena, adapter, AdapterSpec(seed=21))
    version_transition(actor=actor(lena), version=version, action="submit")
    return Event.objects.get(kind="version.submitted")


def test_a_fan_out_run_twice_tells_each_person_once(submitted):
    assert event_fan_out(submitted.pk, "worker-a")
    Event.objects.filter(pk=submitted.pk).update(fanned_out_at=None)  # as if killed before marking
    assert event_fan_out(submitted.pk, "worker-b")
    assert Notification.objects.filter(event=submitted).count() == 2


def test_a_fan_out_already_done_does_nothing(submitted):
    assert event_fan_out(submitted.pk, "worker-a")
    assert not event_fan_out(submitted.pk, "worker-b")


def test_a_fan_out_another_worker_holds_is_left_to_it(submitted):
    assert EVENT_LEASE.claim(submitted.pk, "worker-a", 60)
    assert not event_fan_out(submitted.pk, "worker-b")
    assert not Notification.objects.exists()


def test_each_person_chooses_email_in_the_app_or_off(submitted, alex, paula):
    Preference.objects.create(user=alex, kind="version.submitted", channel=Channel.OFF)
    Preference.objects.create(user=paula, kind="version.submitted", channel=Channel.IN_APP)
    fan_out_all()
    (paulas,) = Notification.objects.all()
    assert paulas.user == paula
    assert paulas.email_status == EmailStatus.NONE


def test_without_a_choice_a_review_waiting_is_emailed(submitted):
    fan_out_all()
    assert set(Notification.objects.values_list("email_status", flat=True)) == {EmailStatus.PENDING}


def test_the_sweeper_sends_again_an_event_whose_task_was_lost(submitted):
    Event.objects.filter(pk=submitted.pk).update(enqueued_at=timezone.now() - timedelta(minutes=5))
    with mock.patch("notifications.tasks.fan_out.delay") as sent:
        counts = sweep()
    sent.assert_called_once_with(submitted.pk)
    assert counts["events"] == 1
    submitted.refresh_from_db()
    assert submitted.enqueued_at > timezone.now() - timedelta(seconds=5)


def test_the_sweeper_leaves_a_fresh_event_and_one_a_worker_holds(submitted):
    with mock.patch("notifications.tasks.fan_out.delay") as sent:
        sweep()  # sent on commit a moment ago
        Event.objects.filter(pk=submitted.pk).update(
            enqueued_at=timezone.now() - timedelta(minutes=5)
        )
        EVENT_LEASE.claim(submitted.pk, "worker-a", 60)
        sweep()
    sent.assert_not_called()


def test_the_sweeper_sends_emails_left_pending(submitted):
    fan_out_all()
    Notification.objects.update(next_email_at=timezone.now() - timedelta(minutes=5))
    with mock.patch("notifications.tasks.send_email.delay") as sent:
        assert sweep()["emails"] == 2
    assert sent.call_count == 2


def test_told_is_limited_to_what_the_department_sees(submitted, fred):
    fan_out_all()
    assert "fred" not in told("version.submitted")
