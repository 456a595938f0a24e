"""The deploy predicate the pages ask and the services enforce: one rule."""

from __future__ import annotations

import pytest

from core.errors import NotAuthorized, NotFound
from core.models import Ability
from serving.deploy_access import can_deploy, deploy_refusal, require_may_deploy
from tests.conftest import actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance_only(root, finance, tmp_path):
    deployment = make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "v", name="fin")
    deployment.allowed_departments.set([finance])
    return deployment


@pytest.fixture
def open_to_all(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "w", name="open")


def test_members_may_deploy_their_adapters_where_the_deployment_accepts_them(
    lena, contracts, open_to_all
):
    assert can_deploy(actor(lena), open_to_all, contracts)
    require_may_deploy(actor(lena), open_to_all, contracts)


def test_a_deployment_for_other_departments_refuses_with_its_reason(lena, contracts, finance_only):
    reason = deploy_refusal(actor(lena), finance_only, contracts)
    assert reason == "Deployment fin does not accept adapters from legal."
    with pytest.raises(NotAuthorized, match=reason):
        require_may_deploy(actor(lena), finance_only, contracts)


def test_outsiders_may_not_and_the_service_says_not_found(fred, contracts, open_to_all):
    assert not can_deploy(actor(fred), open_to_all, contracts)
    with pytest.raises(NotFound):
        require_may_deploy(actor(fred), open_to_all, contracts)


def test_a_token_needs_the_named_ability(lena, legal, contracts, open_to_all):
    from core.services.tokens import token_create

    token, _ = token_create(
        actor=actor(lena), department=legal, name="ship", abilities=[Ability.PROMOTE]
    )
    token_actor = actor(lena, token)
    assert can_deploy(token_actor, open_to_all, contracts, Ability.PROMOTE)
    assert not can_deploy(token_actor, open_to_all, contracts, Ability.ROLLBACK)
    assert not can_deploy(token_actor, open_to_all, contracts, Ability.RETIRE)
