import pytest

from registry.models import VersionStatus
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_approved_version, make_version
from tests.support.adapters import AdapterSpec
from tests.web.conftest import bulk_adapters, clone_versions, query_count

pytestmark = pytest.mark.django_db


def submitted(user, adapter, spec):
    version = make_version(user, adapter, spec)
    return version_transition(actor=actor(user), version=version, action="submit")


def test_it_diffs_a_pending_version_against_the_approved_one(web_alex, lena, paula, contracts):
    make_approved_version(lena, paula, contracts, AdapterSpec(seed=20))
    candidate = submitted(
        lena, contracts, AdapterSpec(seed=21, r=16, target_modules=["q_proj", "k_proj"])
    )
    page = web_alex.get("/reviews/").content.decode()
    assert f'data-testid="review-{candidate.pk}"' in page
    assert "Approved now (<a" in page and ">v1</a>)" in page
    assert '<td class="changed">16</td><td>8</td>' in page
    assert '<span class="chip added">k_proj</span>' in page
    assert '<span class="chip removed" title="removed">v_proj</span>' in page
    assert "Approve v2</button>" in page


def test_a_first_version_says_nothing_is_approved_yet(web_alex, lena, contracts):
    submitted(lena, contracts, AdapterSpec(seed=22))
    assert b"this would be the first" in web_alex.get("/reviews/").content


def test_my_own_submissions_are_shown_but_cannot_be_approved(web_alex, alex, contracts):
    own = submitted(alex, contracts, AdapterSpec(seed=23))
    page = web_alex.get("/reviews/").content.decode()
    assert f'data-testid="review-{own.pk}"' in page
    assert 'disabled aria-describedby="reason-' in page
    assert "Four-eyes rule" in page


def test_approving_from_the_queue_returns_to_the_queue(web_alex, lena, contracts):
    candidate = submitted(lena, contracts, AdapterSpec(seed=24))
    response = web_alex.post(
        f"/versions/{candidate.pk}/actions/",
        {"action": "approve", "comment": "", "next": "/reviews/"},
    )
    assert response["Location"] == "/reviews/"
    candidate.refresh_from_db()
    assert candidate.status == "approved"
    assert b"Nothing is waiting for your review." in web_alex.get("/reviews/").content


def test_members_have_nothing_to_review(web_lena, lena, contracts):
    submitted(lena, contracts, AdapterSpec(seed=25))
    page = web_lena.get("/reviews/").content.decode()
    assert "You approve in no department" in page
    assert "Review queue</a>" not in page  # no nav entry for non-approvers


def test_outsiders_never_see_another_departments_reviews(web_fred, fred, lena, contracts):
    submitted(lena, contracts, AdapterSpec(seed=26))
    assert b"contracts" not in web_fred.get("/reviews/").content


def test_its_query_count_does_not_grow_with_the_queue(web_alex, lena, paula, legal, contracts):
    approved = make_approved_version(lena, paula, contracts, AdapterSpec(seed=27))
    submitted(lena, contracts, AdapterSpec(seed=28))
    small = query_count(web_alex, "/reviews/")
    for adapter in bulk_adapters(legal, lena, 200):
        clone_versions(approved, adapter, 1, VersionStatus.APPROVED)
        clone_versions(approved, adapter, 1, VersionStatus.PENDING_REVIEW, user=lena)
    large = query_count(web_alex, "/reviews/")
    assert large == small
    assert large <= 12
