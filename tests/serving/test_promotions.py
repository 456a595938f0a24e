import pytest

from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import AuditEvent
from serving.models import Promotion, Rollout
from serving.services.promotions import promotion_create, promotion_review
from tests.conftest import actor

pytestmark = pytest.mark.django_db


@pytest.fixture
def production(deployment):
    deployment.requires_promotion_approval = True
    deployment.save()
    return deployment


def test_staging_needs_no_approval_and_starts_a_rollout(lena, deployment, approved_v1):
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    assert promotion.status == "approved"
    assert Rollout.objects.filter(promotion=promotion, kind="promote").count() == 1


def test_production_waits_for_a_second_person(lena, alex, production, approved_v1):
    promotion = promotion_create(actor=actor(lena), deployment=production, version=approved_v1)
    assert promotion.status == "pending_approval"
    assert not Rollout.objects.exists()

    approved = promotion_review(actor=actor(alex), promotion=promotion, approve=True)

    assert approved.status == "approved" and approved.reviewed_by == alex
    assert Rollout.objects.filter(promotion=promotion).count() == 1
    assert AuditEvent.objects.filter(
        action="promotion.approve", object_id=str(promotion.pk)
    ).exists()


def test_requester_cannot_approve_their_own_promotion(alex, production, approved_v1):
    promotion = promotion_create(actor=actor(alex), deployment=production, version=approved_v1)
    with pytest.raises(NotAuthorized, match="Four-eyes"):
        promotion_review(actor=actor(alex), promotion=promotion, approve=True)
    assert not Rollout.objects.exists()


def test_members_and_tokens_cannot_approve_promotions(
    lena, legal_token, paula, production, approved_v1
):
    promotion = promotion_create(actor=actor(paula), deployment=production, version=approved_v1)
    with pytest.raises(NotAuthorized):
        promotion_review(actor=actor(lena), promotion=promotion, approve=True)
    with pytest.raises(NotAuthorized):
        promotion_review(actor=actor(lena, legal_token), promotion=promotion, approve=True)


def test_outsiders_cannot_see_or_promote(fred, deployment, approved_v1):
    with pytest.raises(NotFound):
        promotion_create(actor=actor(fred), deployment=deployment, version=approved_v1)


def test_reject_needs_a_comment_and_a_second_review_is_409(
    lena, alex, paula, production, approved_v1
):
    promotion = promotion_create(actor=actor(lena), deployment=production, version=approved_v1)
    with pytest.raises(ValidationFailed):
        promotion_review(actor=actor(alex), promotion=promotion, approve=False)
    promotion_review(actor=actor(alex), promotion=promotion, approve=False, comment="not now")
    with pytest.raises(Conflict, match="rejected"):
        promotion_review(actor=actor(paula), promotion=promotion, approve=True)


def test_a_deployment_can_be_limited_to_departments(lena, finance, deployment, approved_v1):
    deployment.allowed_departments.set([finance])
    with pytest.raises(NotAuthorized, match="does not accept adapters from legal"):
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)


def test_promoting_the_served_version_again_is_409(lena, deployment, approved_v1):
    from serving.rollouts.engine import rollout_execute

    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout_execute(promotion.rollouts.get().pk, "w")
    with pytest.raises(Conflict, match="already served"):
        promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)


def test_token_with_the_promote_ability_may_promote(lena, legal_token, deployment, approved_v1):
    promotion = promotion_create(
        actor=actor(lena, legal_token), deployment=deployment, version=approved_v1
    )
    assert Promotion.objects.get(pk=promotion.pk).status == "approved"
