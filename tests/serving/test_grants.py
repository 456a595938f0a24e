"""Grants (serving/services/grants.py): Finance asks to call Legal's
legal-contracts; an approver of Legal who did not ask decides (four eyes); the
grant lets Finance's keys call it at the door until it ends, is revoked, or the
tick expires it. Each move is a compare-and-swap on the status read."""

from __future__ import annotations

import pytest
from django.utils import timezone

from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import AuditEvent, Membership, Role
from serving.door.selectors import door_access
from serving.models import AdapterGrant, GrantStatus, ServedAdapter
from serving.rules.transitions import GRANT_TRANSITIONS
from serving.services.grants import grant_decide, grant_request, grant_revoke, grants_expire
from serving.tasks import door_access_tick
from tests.conftest import _user, actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(root, tmp_path, contracts, approved_v1):
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")
    ServedAdapter.objects.create(deployment=deployment, adapter=contracts, version=approved_v1)
    return deployment


@pytest.fixture
def fiona(finance):
    """An approver of Finance: of the asking side, not the adapter's."""
    user = _user("fiona")
    Membership.objects.create(user=user, department=finance, role=Role.APPROVER)
    return user


def _ask(who, department, days=30, served_name="legal-contracts", reason="invoice checks"):
    return grant_request(
        actor=actor(who),
        department=department,
        served_name=served_name,
        expires_in_days=days,
        reason=reason,
    )


def test_an_approved_grant_lets_the_asking_department_call_the_adapter(
    fred, alex, finance, deployment
):
    grant = _ask(fred, finance)
    assert grant.status == GrantStatus.REQUESTED
    assert door_access(deployment).models_for("finance") == ["tiny-llama"]

    grant_decide(actor=actor(alex), grant=grant, approve=True)

    assert door_access(deployment).models_for("finance") == ["legal-contracts", "tiny-llama"]
    events = AuditEvent.objects.filter(object_type="serving.adaptergrant").order_by("id")
    # The request is in both sides' logs: the asking one, then the adapter's.
    assert [(e.action, e.actor_id, e.department.slug) for e in events] == [
        ("grant.requested", fred.pk, "finance"),
        ("grant.requested", fred.pk, "legal"),
        ("grant.approved", alex.pk, "legal"),
    ]


def test_the_requester_cannot_approve_their_own_grant(alex, finance, legal, deployment):
    Membership.objects.create(user=alex, department=finance, role=Role.MEMBER)
    grant = _ask(alex, finance)

    with pytest.raises(NotAuthorized, match="Four-eyes"):
        grant_decide(actor=actor(alex), grant=grant, approve=True)

    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.REQUESTED


def test_an_approver_of_another_department_cannot_approve(fred, fiona, finance, deployment):
    grant = _ask(fred, finance)

    # Not told whose adapter it is: a name nobody serves gets the same words.
    with pytest.raises(NotAuthorized, match="adapter's department") as refused:
        grant_decide(actor=actor(fiona), grant=grant, approve=True)
    assert "legal" not in refused.value.message

    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.REQUESTED


def test_a_member_of_the_adapters_department_cannot_approve(fred, lena, finance, deployment):
    grant = _ask(fred, finance)

    with pytest.raises(NotAuthorized):
        grant_decide(actor=actor(lena), grant=grant, approve=True)


def test_only_a_member_of_the_asking_department_may_ask(lena, finance):
    with pytest.raises(NotFound):
        _ask(lena, finance)
    assert not AdapterGrant.objects.exists()


def test_an_outsider_to_both_sides_gets_a_404(fred, finance, legal, deployment):
    grant = _ask(fred, finance)
    hr_person = _user("hank")
    from core.models import Department

    hr = Department.objects.create(slug="hr", name="HR")
    Membership.objects.create(user=hr_person, department=hr, role=Role.APPROVER)

    with pytest.raises(NotFound):
        grant_decide(actor=actor(hr_person), grant=grant, approve=True)
    with pytest.raises(NotFound):
        grant_revoke(actor=actor(hr_person), grant=grant)


@pytest.mark.parametrize(
    "served_name,reason,error,message",
    [
        ("legal-contracts", "  ", ValidationFailed, "why"),
        # Bad input is refused before the name is looked up: the same answer.
        ("no-such-adapter", "  ", ValidationFailed, "why"),
        ("not a name!", "x", ValidationFailed, "not a served name"),
    ],
)
def test_a_bad_request_names_the_problem_and_writes_nothing(
    fred, finance, contracts, served_name, reason, error, message
):
    with pytest.raises(error, match=message):
        _ask(fred, finance, served_name=served_name, reason=reason)
    assert not AdapterGrant.objects.exists()


def test_a_department_needs_no_grant_for_its_own_adapter(lena, legal, contracts):
    with pytest.raises(ValidationFailed, match="own adapter"):
        _ask(lena, legal)


@pytest.mark.parametrize("days", [0, 366, True])
def test_a_grant_ends_within_a_stated_maximum(fred, finance, contracts, days):
    with pytest.raises(ValidationFailed, match="between 1 and 365"):
        _ask(fred, finance, days=days)


def test_one_live_grant_per_adapter_and_department(fred, alex, finance, deployment):
    grant = _ask(fred, finance)
    with pytest.raises(Conflict, match="already has a grant"):
        _ask(fred, finance)

    grant_decide(actor=actor(alex), grant=grant, approve=False, comment="not this quarter")
    assert _ask(fred, finance).status == GrantStatus.REQUESTED


def test_refusing_needs_a_comment(fred, alex, finance, deployment):
    grant = _ask(fred, finance)

    with pytest.raises(ValidationFailed, match="comment"):
        grant_decide(actor=actor(alex), grant=grant, approve=False)
    grant_decide(actor=actor(alex), grant=grant, approve=False, comment="no")
    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.REFUSED


def test_a_second_decision_on_a_stale_read_is_a_conflict(fred, alex, paula, finance, deployment):
    grant = _ask(fred, finance)
    stale = AdapterGrant.objects.get(pk=grant.pk)
    grant_decide(actor=actor(alex), grant=grant, approve=True)

    # paula read it as requested; the compare-and-swap finds it approved.
    with pytest.raises(Conflict, match="approved"):
        grant_decide(actor=actor(paula), grant=stale, approve=False, comment="too late")
    assert AdapterGrant.objects.get(pk=grant.pk).decided_by == alex


@pytest.mark.parametrize("revoker", ["alex", "fiona"])
def test_either_sides_approvers_revoke_and_the_door_loses_it(
    fred, alex, fiona, finance, deployment, revoker, door_syncs
):
    grant = _ask(fred, finance)
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    who = {"alex": alex, "fiona": fiona}[revoker]

    with door_syncs() as sent:
        grant_revoke(actor=actor(who), grant=grant, comment="project over")

    assert door_access(deployment).models_for("finance") == ["tiny-llama"]
    assert sent == [deployment.pk]
    event = AuditEvent.objects.get(action="grant.revoked")
    assert (event.actor_id, event.from_state, event.to_state) == (who.pk, "approved", "revoked")


def test_a_member_of_the_asking_department_cannot_revoke(fred, alex, finance, deployment):
    grant = _ask(fred, finance)
    grant_decide(actor=actor(alex), grant=grant, approve=True)

    with pytest.raises(NotAuthorized):
        grant_revoke(actor=actor(fred), grant=grant)


def test_grants_past_their_end_expire_on_the_tick_and_leave_the_table(
    fred, alex, finance, deployment, settings, door_syncs
):
    settings.SERVING_DOORS = {}  # the tick's catch-up sync of every door: none here
    grant = _ask(fred, finance)
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    AdapterGrant.objects.filter(pk=grant.pk).update(expires_at=timezone.now())
    assert door_access(deployment).models_for("finance") == ["tiny-llama"]

    with door_syncs() as sent:
        assert door_access_tick() == 1
    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.EXPIRED
    assert sent == [deployment.pk]
    events = AuditEvent.objects.filter(action="grant.expired").order_by("id")
    assert [(e.department.slug, e.actor_id, e.actor_label, e.from_state) for e in events] == [
        ("finance", None, "system", "approved"),
        ("legal", None, "system", "approved"),
    ]
    assert grants_expire() == 0


def test_a_request_nobody_decided_expires_too_and_cannot_be_approved_after(
    fred, alex, finance, deployment
):
    grant = _ask(fred, finance)
    AdapterGrant.objects.filter(pk=grant.pk).update(expires_at=timezone.now())
    grant.refresh_from_db()

    with pytest.raises(Conflict, match="end date"):
        grant_decide(actor=actor(alex), grant=grant, approve=True)
    assert grants_expire() == 1
    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.EXPIRED


def test_the_transition_table_allows_only_what_the_lifecycle_says():
    assert {
        "requested": frozenset({"approved", "refused", "expired"}),
        "approved": frozenset({"revoked", "expired"}),
        "refused": frozenset(),
        "revoked": frozenset(),
        "expired": frozenset(),
    } == GRANT_TRANSITIONS


def test_the_tick_sends_every_front_door_its_table_again(
    deployment, root, tmp_path, settings, door_syncs
):
    make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "doorless", name="doorless")
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:1", "not-yet-made": "127.0.0.1:2"}

    with door_syncs() as sent:
        assert door_access_tick() == 0

    assert sent == [deployment.pk]


# -- issue 43: people, not accounts; grants end with their adapter ----------------


def test_a_grant_request_records_the_people_behind_it(fred, finance, deployment):
    grant = _ask(fred, finance)
    assert grant.author_ids == [fred.pk]
    assert grant.authors == {fred.pk}


def test_four_eyes_on_grants_compares_people_not_accounts(fred, alex, finance, deployment):
    """A request that alex is behind (through a pipeline's account, say) is not
    alex's to decide, though the account that asked was fred's."""
    grant = _ask(fred, finance)
    AdapterGrant.objects.filter(pk=grant.pk).update(author_ids=[fred.pk, alex.pk])
    grant.refresh_from_db()

    from serving.services.grants import can_decide

    assert not can_decide(actor(alex), grant)
    with pytest.raises(NotAuthorized, match="Four-eyes"):
        grant_decide(actor=actor(alex), grant=grant, approve=True)
    assert AdapterGrant.objects.get(pk=grant.pk).status == GrantStatus.REQUESTED


def test_a_grant_ends_when_its_adapter_is_retired_and_does_not_revive(
    fred, alex, lena, finance, deployment, contracts, approved_v1
):
    from serving.rollouts.engine import rollout_execute
    from serving.services.promotions import retire

    grant = _ask(fred, finance)
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    assert "legal-contracts" in door_access(deployment).models_for("finance")

    rollout = retire(actor=actor(lena), deployment=deployment, adapter=contracts)
    rollout_execute(rollout.pk, "w")

    grant.refresh_from_db()
    assert grant.status == GrantStatus.EXPIRED and grant.ended_at is not None
    events = AuditEvent.objects.filter(action="grant.expired").order_by("id")
    assert [(e.department.slug, e.details["reason"]) for e in events] == [
        ("finance", "adapter_retired"),
        ("legal", "adapter_retired"),
    ]
    # Served again: Finance must ask again.
    ServedAdapter.objects.filter(deployment=deployment, adapter=contracts).update(
        version=approved_v1
    )
    assert door_access(deployment).models_for("finance") == ["tiny-llama"]


def test_a_grant_stays_while_another_deployment_still_serves_the_adapter(
    root, fred, alex, lena, finance, deployment, contracts, approved_v1, tmp_path
):
    from serving.rollouts.engine import rollout_execute
    from serving.services.promotions import retire

    other = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "other", name="other-cpu")
    ServedAdapter.objects.create(deployment=other, adapter=contracts, version=approved_v1)
    grant = _ask(fred, finance)
    grant_decide(actor=actor(alex), grant=grant, approve=True)
    rollout_execute(retire(actor=actor(lena), deployment=deployment, adapter=contracts).pk, "w")
    grant.refresh_from_db()
    assert grant.status == GrantStatus.APPROVED
    assert "legal-contracts" in door_access(other).models_for("finance")


# -- issue 43: asking tells nothing of which served names exist ------------------


@pytest.fixture
def unknown(fred, finance, deployment):
    """Finance asks for a name nobody serves (legal-contracts is served)."""
    return _ask(fred, finance, served_name="legal-secrets")


def test_a_name_nobody_serves_is_kept_as_a_request_like_any_other(fred, finance, unknown):
    served = _ask(fred, finance)

    assert (unknown.adapter, unknown.served_name, unknown.status) == (
        None,
        "legal-secrets",
        GrantStatus.REQUESTED,
    )
    assert (served.served_name, served.status) == ("legal-contracts", GrantStatus.REQUESTED)
    with pytest.raises(Conflict, match="already has a grant"):
        _ask(fred, finance, served_name="legal-secrets")


@pytest.mark.parametrize("who", ["alex", "fiona", "root"])
def test_nobody_can_approve_a_request_for_a_name_nobody_serves(alex, fiona, root, unknown, who):
    decider = {"alex": alex, "fiona": fiona, "root": root}[who]

    # alex (an approver of Legal) does not see it at all; the others may not decide.
    with pytest.raises(NotFound if who == "alex" else NotAuthorized):
        grant_decide(actor=actor(decider), grant=unknown, approve=True)
    with pytest.raises(NotFound if who == "alex" else NotAuthorized):
        grant_decide(actor=actor(decider), grant=unknown, approve=False, comment="no")
    assert AdapterGrant.objects.get(pk=unknown.pk).status == GrantStatus.REQUESTED


def test_a_request_for_a_name_nobody_serves_expires_on_the_tick(unknown):
    AdapterGrant.objects.filter(pk=unknown.pk).update(expires_at=timezone.now())

    assert grants_expire() == 1

    assert AdapterGrant.objects.get(pk=unknown.pk).status == GrantStatus.EXPIRED


def test_no_other_department_hears_of_a_name_nobody_serves(unknown):
    from notifications.models import Event

    AdapterGrant.objects.filter(pk=unknown.pk).update(expires_at=timezone.now())
    grants_expire()

    logged = AuditEvent.objects.filter(object_type="serving.adaptergrant")
    assert [(e.action, e.department.slug) for e in logged.order_by("id")] == [
        ("grant.requested", "finance"),
        ("grant.expired", "finance"),
    ]
    told = list(Event.objects.filter(kind__startswith="grant."))
    assert [(e.kind, e.department.slug, e.audience) for e in told] == [
        ("grant.expired", "finance", [unknown.department_id])
    ]


def test_the_doors_table_does_not_change_for_a_name_nobody_serves(fred, finance, deployment):
    before = door_access(deployment)

    _ask(fred, finance, served_name="legal-secrets")

    assert door_access(deployment) == before
