"""A canary's decision (serving.models.Canary) is an explicit transition table
applied with compare-and-swap: every move the table does not list is refused,
and of a person's promote or abort and the gates' verdict in the same moment,
exactly one wins while the other changes nothing."""

from __future__ import annotations

import itertools
import threading

import pytest
from django.db import connection

from core.errors import Conflict
from core.models import AuditEvent
from core.state import move
from serving.models import Canary, CanaryRequest, CanaryState, Deployment, Rollout, RolloutStatus
from serving.rollouts.canary import canary_decide
from serving.rules.transitions import CANARY_TRANSITIONS, CANARY_UNDECIDED
from serving.services.rollout_requests import rollout_canary_decide
from tests.conftest import actor, requires_postgres
from tests.factories import make_adapter, make_version

C = CanaryState
ALLOWED = {
    (current, target) for current, targets in CANARY_TRANSITIONS.items() for target in targets
}
REFUSED = [
    (current, target)
    for current, target in itertools.product(C.values, C.values)
    if current != target and (current, target) not in ALLOWED
]
REPORT = {"verdict": {"outcome": "pass", "reason": "held", "gates": []}}


def test_the_table_says_what_the_lifecycle_says():
    assert {
        "waiting": frozenset({"baking", "passed", "ended"}),
        "baking": frozenset({"passed", "failed", "promote_asked", "abort_asked", "ended"}),
        "promote_asked": frozenset({"promoted", "ended"}),
        "abort_asked": frozenset({"aborted", "ended"}),
        "passed": frozenset(),
        "failed": frozenset(),
        "promoted": frozenset(),
        "aborted": frozenset(),
        "ended": frozenset(),
    } == CANARY_TRANSITIONS
    assert set(CANARY_TRANSITIONS) == set(C.values)
    assert {s for s, nxt in CANARY_TRANSITIONS.items() if nxt} == CANARY_UNDECIDED


@pytest.fixture
def rollout(lena, legal):
    contracts = make_adapter(lena, legal)
    version = make_version(lena, contracts)
    deployment = Deployment.objects.create(name="canary-state", base_model_name="tiny")
    return Rollout.objects.create(
        deployment=deployment,
        adapter=contracts,
        target_version=version,
        kind="swap",
        status=RolloutStatus.BAKING,
    )


@pytest.mark.django_db
def test_every_move_the_table_does_not_list_is_refused_and_changes_nothing(rollout):
    canary = Canary.objects.create(rollout=rollout, share=10, bake_seconds=60)
    for current, target in REFUSED:
        Canary.objects.filter(pk=canary.pk).update(state=current)
        canary.refresh_from_db()
        with pytest.raises(Conflict) as refused:
            move(canary, CANARY_TRANSITIONS, target, field="state")
        assert refused.value.code == "invalid_transition"
        assert Canary.objects.get(pk=canary.pk).state == current, (current, target)
    # Every move it lists does go through.
    for current, target in sorted(ALLOWED):
        Canary.objects.filter(pk=canary.pk).update(state=current)
        canary.refresh_from_db()
        assert move(canary, CANARY_TRANSITIONS, target, field="state"), (current, target)
        assert Canary.objects.get(pk=canary.pk).state == target


@pytest.mark.django_db
def test_the_gates_lose_cleanly_to_a_person_who_asked_first(rollout, alex):
    canary = Canary.objects.create(rollout=rollout, share=10, bake_seconds=60, state=C.BAKING)
    # The worker read the canary baking; then a person aborts it.
    read_by_worker = Canary.objects.get(pk=canary.pk)
    rollout_canary_decide(actor=actor(alex), rollout=rollout, request=CanaryRequest.ABORT)

    assert not canary_decide(rollout, read_by_worker, C.PASSED, "gates passed", REPORT)
    canary.refresh_from_db()
    assert (canary.state, canary.decided_by, canary.gates) == (C.ABORT_ASKED, alex, {})
    assert not AuditEvent.objects.filter(action="rollout.canary_passed").exists()
    # At its next look the worker carries out the person's decision.
    assert canary_decide(rollout, canary, C.ABORTED, f"Aborted by {alex}.", REPORT)
    assert Canary.objects.get(pk=canary.pk).state == C.ABORTED
    assert AuditEvent.objects.filter(action="rollout.canary_aborted").count() == 1


@pytest.mark.django_db
def test_a_person_is_refused_once_the_gates_decided(rollout, alex):
    canary = Canary.objects.create(rollout=rollout, share=10, bake_seconds=60, state=C.BAKING)
    assert canary_decide(rollout, canary, C.FAILED, "gates failed", REPORT)
    with pytest.raises(Conflict) as refused:
        rollout_canary_decide(actor=actor(alex), rollout=rollout, request=CanaryRequest.PROMOTE)
    assert refused.value.code == "canary_not_baking"
    assert "failed" in refused.value.message
    assert Canary.objects.get(pk=canary.pk).decided_by is None  # the gates decided


def _same_moment(canary: Canary, rollout: Rollout, person) -> tuple[object, object]:
    """The gates' verdict and a person's abort, both from a baking canary read
    before either writes. Returns (gates won?, the person's answer)."""
    both_read = threading.Barrier(2)
    results: dict[str, object] = {}

    def gates():
        row = Canary.objects.get(pk=canary.pk)
        both_read.wait(timeout=30)
        try:
            results["gates"] = canary_decide(rollout, row, C.PASSED, "held", REPORT)
        finally:
            connection.close()

    def asks():
        both_read.wait(timeout=30)
        try:
            rollout_canary_decide(actor=actor(person), rollout=rollout, request=CanaryRequest.ABORT)
            results["person"] = True
        except Conflict as refused:
            results["person"] = refused.code
        finally:
            connection.close()

    threads = [threading.Thread(target=gates), threading.Thread(target=asks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results["gates"], results["person"]


@pytest.mark.postgres
@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_a_person_and_the_gates_at_the_same_moment_one_wins_each_time(rollout, alex):
    canary = Canary.objects.create(rollout=rollout, share=10, bake_seconds=60, state=C.BAKING)
    for _ in range(20):
        Canary.objects.filter(pk=canary.pk).update(state=C.BAKING, decided_by=None, gates={})
        gates_won, person = _same_moment(canary, rollout, alex)
        state = Canary.objects.get(pk=canary.pk).state
        if gates_won:
            assert (state, person) == (C.PASSED, "canary_not_baking")
        else:
            assert (state, person) == (C.ABORT_ASKED, True)
