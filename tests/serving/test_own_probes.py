"""The control plane's own probes, marked so /metrics never makes them demand
(serving.records.own_probes): the marks and their compare-and-swap settling."""

from datetime import timedelta

import pytest

from serving.models import OwnProbe, Replica
from serving.records.own_probes import (
    own_probes_marked,
    own_probes_record,
    own_probes_settle,
)

pytestmark = pytest.mark.django_db


def test_a_mark_settles_only_after_its_grace_and_only_if_not_probed_again(deployment, settings):
    settings.SERVING_OWN_PROBE_GRACE_SECONDS = 10
    replica = Replica.objects.create(deployment=deployment, base_url="http://127.0.0.1:9/v1")
    own_probes_record([replica], ["legal", "hr", "legal"])
    marked = own_probes_marked([replica.pk])
    assert set(marked[replica.pk]) == {"legal", "hr"}
    at = marked[replica.pk]["legal"]

    # A read begun within the grace leaves them.
    assert own_probes_settle(marked, at + timedelta(seconds=5)) == 0
    # legal is probed again before the settling read: it stays, hr goes.
    OwnProbe.objects.filter(served_name="legal").update(probed_at=at + timedelta(seconds=1))
    assert own_probes_settle(marked, at + timedelta(seconds=11)) == 1
    assert list(OwnProbe.objects.values_list("served_name", flat=True)) == ["legal"]
