import pytest

from registry.models import VersionStatus
from registry.services.versions import version_transition
from tests.conftest import actor
from tests.factories import make_approved_version, make_version
from tests.support.adapters import AdapterSpec
from tests.support.pages import bulk_adapters, clone_versions, query_count

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


def test_training_metrics_from_the_runs_are_compared(web_alex, lena, paula, contracts):
    from registry.models import AdapterVersion

    approved = make_approved_version(lena, paula, contracts, AdapterSpec(seed=40))
    candidate = submitted(lena, contracts, AdapterSpec(seed=41))
    # Snapshots as registration from an MLflow run records them.
    AdapterVersion.objects.filter(pk=approved.pk).update(run_metrics={"eval_loss": 0.91})
    AdapterVersion.objects.filter(pk=candidate.pk).update(
        run_metrics={"eval_loss": 0.72, "exact_match": 0.64}
    )

    page = web_alex.get("/reviews/").content.decode()

    assert "eval_loss" in page and "exact_match" in page
    assert '<td class="changed">0.72</td>' in page
    assert "<td>0.91</td>" in page
    assert "No training metrics recorded" not in page


def test_the_version_page_shows_the_run_its_metrics_and_warnings(
    web_lena, lena, contracts, settings
):
    from registry.models import AdapterVersion

    settings.MLFLOW_TRACKING_URI = "http://mlflow.internal:5000"
    settings.MLFLOW_UI_URL = ""
    version = make_version(lena, contracts)
    AdapterVersion.objects.filter(pk=version.pk).update(
        mlflow_run_id="abc123",
        mlflow_experiment_id="7",
        mlflow_experiment_name="legal-finetunes",
        run_metrics={"eval_loss": 0.72},
        lineage_warnings=["The run trained on base model X, the adapter says Y."],
    )

    page = web_lena.get(f"/versions/{version.pk}/").content.decode()

    assert 'href="http://mlflow.internal:5000/#/experiments/7/runs/abc123"' in page
    assert "legal-finetunes" in page and "eval_loss" in page and "0.72" in page
    assert "the adapter says Y" in page
