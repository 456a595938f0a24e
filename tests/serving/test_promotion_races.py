"""Races on PostgreSQL between promotions of a deployment: the registered-adapter
limit holds however many promotions of new adapters arrive at the same moment."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from serving.models import Rollout
from serving.services import promotions
from serving.services.promotions import GateRefused, promotion_create
from tests.conftest import actor, requires_postgres
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import AdapterSpec

pytestmark = [
    pytest.mark.postgres,
    requires_postgres(),
    pytest.mark.django_db(transaction=True),
]


def test_two_promotions_past_the_gate_at_once_cannot_both_take_the_last_place(
    monkeypatch, lena, alex, legal, deployment
):
    deployment.max_registered_adapters = 1
    deployment.save()
    versions = [
        make_approved_version(lena, alex, make_adapter(lena, legal, name=name), AdapterSpec(seed=i))
        for i, name in enumerate(["contracts", "nda"], start=1)
    ]
    # Both pass the gate before either writes anything: the window the lock closes.
    both_gated = threading.Barrier(2)
    real_gate = promotions._require_gate

    def gate_then_wait(*args):
        report = real_gate(*args)
        both_gated.wait(timeout=30)
        return report

    monkeypatch.setattr(promotions, "_require_gate", gate_then_wait)
    outcomes: list = []

    def promote(version):
        try:
            promotion_create(actor=actor(lena), deployment=deployment, version=version)
            outcomes.append("promoted")
        except GateRefused as refusal:
            outcomes.append(refusal.message)
        finally:
            connection.close()

    threads = [threading.Thread(target=promote, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(outcomes) == 2 and outcomes.count("promoted") == 1, outcomes
    (refused,) = [o for o in outcomes if o != "promoted"]
    assert "would exceed staging-cpu's limit of 1 registered adapters" in refused
    assert Rollout.objects.count() == 1
