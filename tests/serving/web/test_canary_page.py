"""The rollout page of a traffic canary: the split, the gates and the countdown,
polled live; approvers promote it now or abort it from there."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from serving.models import Canary, CanaryState, Rollout, RolloutStatus
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def baking(settings, tmp_path, lena, deployment, approved_v1, approved_v2) -> Rollout:
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:1"}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    first = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(first.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    promotion = promotion_create(
        actor=actor(lena),
        deployment=deployment,
        version=approved_v2,
        canary_share=10,
        canary_bake_seconds=120,
    )
    rollout = promotion.rollouts.get()
    canary = deployment.replicas.order_by("base_url").first()
    # What the worker writes while it bakes (serving/rollouts/canary.py).
    report = {
        "weights": {str(canary.pk): 10, "9999": 90},
        "share": 10,
        "canary": {"requests": 40, "errors": 1, "latency_ms": 120.0},
        "baseline": {"requests": 360, "errors": 0, "latency_ms": 100.0},
        "verdict": {
            "outcome": "wait",
            "reason": "baking",
            "gates": [
                {
                    "name": "errors",
                    "verdict": "pass",
                    "canary": 0.025,
                    "baseline": 0.0,
                    "limit": 0.02,
                    "message": "error rate 2.5% against 0.0%",
                },
                {
                    "name": "latency",
                    "verdict": "wait",
                    "canary": 120.0,
                    "baseline": 100.0,
                    "limit": 200.0,
                    "message": "120 ms against 100 ms",
                },
            ],
        },
        "checked_at": timezone.now().isoformat(),
    }
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.BAKING)
    Canary.objects.filter(rollout=rollout).update(
        state=CanaryState.BAKING,
        replica=canary,
        bake_until=timezone.now() + timedelta(seconds=90),
        gates=report,
    )
    return rollout


def test_the_page_shows_the_split_the_gates_and_the_countdown_live(web_alex, baking):
    html = web_alex.get(f"/rollouts/{baking.pk}/live/", **HTMX).content.decode()
    assert 'hx-trigger="every 1s"' in html  # polled while it bakes
    assert "Baking: the canary replica serves v2 to 10&nbsp;%" in html
    assert "<strong>10&nbsp;%</strong> of the requests to v2" in html
    assert "front-door weights: 10 / 90" in html
    countdown = html.split('data-testid="canary-countdown">')[1].split("</p>")[0]
    seconds = int(countdown.split("<strong>")[1].split("&nbsp;")[0])
    # Counting down from 90 (a live countdown, not the bake's 120 s), with room
    # for the light run's stalls (niced beside vLLM) since the fixture set it.
    assert 60 <= seconds <= 90
    assert "left of 120&nbsp;s" in countdown
    gates = html.split('data-testid="canary-gates"')[1].split("</table>")[0]
    assert "2.5\xa0%" in gates and "≤&nbsp;2.0\xa0%" in gates
    assert "120&nbsp;ms" in gates and 'data-verdict="wait"' in gates
    assert '<td class="num">40</td>' in gates and '<td class="num">360</td>' in gates
    assert 'data-testid="canary-promote"' in html
    assert 'data-testid="canary-promote" disabled' not in html


def test_members_see_the_canary_but_may_not_decide_it(web_lena, baking):
    html = web_lena.get(f"/rollouts/{baking.pk}/").content.decode()
    assert 'data-testid="canary-promote" disabled' in html
    assert 'data-testid="canary-abort" disabled' in html
    assert "Only an approver of this department or a platform admin may decide." in html
    # The member sees a label, not the replica's address.
    assert baking.deployment.replicas.order_by("base_url").first().base_url not in html
    assert web_lena.post(f"/rollouts/{baking.pk}/canary/abort/").status_code == 302
    baking.refresh_from_db()
    assert baking.canary.requested == ""


def test_an_approver_aborts_it_from_the_page(web_alex, baking):
    answer = web_alex.post(f"/rollouts/{baking.pk}/canary/abort/", follow=True)
    html = answer.content.decode()
    baking.refresh_from_db()
    assert baking.canary.requested == "abort"
    assert "The canary is aborted" in html
    assert "<strong>abort</strong> asked" in html
    assert 'data-testid="canary-abort"' not in html  # decided: no more buttons
    assert web_alex.post(f"/rollouts/{baking.pk}/canary/sideways/").status_code == 404


def test_outsiders_get_a_404(web_fred, baking):
    assert web_fred.get(f"/rollouts/{baking.pk}/live/", **HTMX).status_code == 404
    assert web_fred.post(f"/rollouts/{baking.pk}/canary/promote/").status_code == 404


def test_a_traffic_canary_is_started_from_the_promote_form(
    web_lena, settings, tmp_path, lena, deployment, approved_v1, approved_v2
):
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:1"}
    settings.SERVING_DOOR_DIR = tmp_path / "gateways"
    first = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert rollout_execute(first.rollouts.get().pk, "w") == RolloutStatus.SUCCEEDED
    form = {"deployment": deployment.name, "canary_share": "10", "canary_bake_seconds": "60"}
    gate = web_lena.get(f"/versions/{approved_v2.pk}/promote/", form, **HTMX).content.decode()
    assert "Canary: 10&nbsp;% of the traffic to the new version for 60&nbsp;s" in gate
    assert 'name="canary_share" value="10"' in gate
    answer = web_lena.post(f"/versions/{approved_v2.pk}/promote/", form)
    assert answer.status_code == 302, answer.content
    rollout = Rollout.objects.get(target_version=approved_v2)
    assert (rollout.canary.share, rollout.canary.bake_seconds) == (10, 60)
    page = web_lena.get(f"/rollouts/{rollout.pk}/").content.decode()
    assert "Traffic canary: 10&nbsp;% for 60&nbsp;s" in page


def test_a_traffic_canary_the_deployment_cannot_run_is_refused_with_the_reason(
    web_lena, lena, deployment, approved_v1
):
    form = {"deployment": deployment.name, "canary_share": "10", "canary_bake_seconds": "60"}
    answer = web_lena.post(f"/versions/{approved_v1.pk}/promote/", form)
    assert answer.status_code == 409
    assert "has no front door" in answer.content.decode()
    assert not Rollout.objects.exists()


def test_the_deployment_and_adapter_pages_say_a_canary_takes_its_share(
    web_lena, baking, deployment, contracts
):
    for url in (f"/deployments/{deployment.name}/", f"/adapters/{contracts.pk}/"):
        html = web_lena.get(url).content.decode()
        split = html.split('data-testid="canary-split">')[1].split("</p>")[0]
        assert f"{contracts.served_name} v2</a> takes 10&nbsp;% of its traffic" in split
        assert "s of its bake left" in split


def test_the_admin_shows_the_rollout_s_canary_read_only(client, root, baking):
    client.force_login(root)
    page = client.get(f"/admin/serving/rollout/{baking.pk}/change/").content.decode()
    assert "Canary" in page and "Baking" in page
    assert 'name="canary-0-state"' not in page  # read-only: no form field


def test_a_decided_canary_shows_its_decision_and_an_ended_one_says_so(web_alex, baking):
    Canary.objects.filter(rollout=baking).update(state=CanaryState.FAILED)
    html = web_alex.get(f"/rollouts/{baking.pk}/live/", **HTMX).content.decode()
    assert '<span class="badge badge-failed">Gates failed</span>' in html
    assert 'data-testid="canary-abort"' not in html
    Canary.objects.filter(rollout=baking).update(state=CanaryState.ENDED)
    html = web_alex.get(f"/rollouts/{baking.pk}/live/", **HTMX).content.decode()
    assert "Ended before anything was decided." in html
    assert 'data-testid="canary-outcome"' not in html


def test_the_decide_buttons_ask_can_decide_canary_and_the_decision_refuses_as_it_says(
    web_lena, web_alex, lena, alex, baking
):
    from core.errors import Conflict, NotAuthorized
    from serving.services.rollout_requests import (
        can_decide_canary,
        canary_decidable,
        rollout_canary_decide,
    )

    # Baking undecided: decidable; a member may not, the buttons are off.
    assert canary_decidable(baking) and not can_decide_canary(actor(lena), baking)
    html = web_lena.get(f"/rollouts/{baking.pk}/").content.decode()
    assert 'data-testid="canary-promote" disabled' in html
    with pytest.raises(NotAuthorized):
        rollout_canary_decide(actor=actor(lena), rollout=baking, request="promote")
    assert can_decide_canary(actor(alex), baking)
    rollout_canary_decide(actor=actor(alex), rollout=baking, request="abort")
    baking.refresh_from_db()
    baking.canary.refresh_from_db()
    # Decided: no buttons, and a second decision refuses.
    assert not canary_decidable(baking) and not can_decide_canary(actor(alex), baking)
    html = web_alex.get(f"/rollouts/{baking.pk}/").content.decode()
    assert 'data-testid="canary-promote"' not in html
    with pytest.raises(Conflict):
        rollout_canary_decide(actor=actor(alex), rollout=baking, request="promote")
