import re

import pytest

from core.models import AuditEvent
from registry.services.versions import FOUR_EYES_VERSION, version_transition
from tests.conftest import actor
from tests.factories import make_approved_version, make_version
from tests.support.adapters import AdapterSpec
from tests.support.pages import bulk_events, query_count

pytestmark = pytest.mark.django_db


def buttons(html: str) -> dict[str, bool]:
    """{button label: enabled} for every lifecycle button on the page."""
    found = {}
    for attrs, label in re.findall(r"<button type=\"submit\"([^>]*)>([^<]+)</button>", html):
        found[label.strip()] = "disabled" not in attrs
    found.pop("Sign out", None)
    return found


def post_action(client, version, action, comment="", next_url=""):
    data = {"action": action, "comment": comment}
    if next_url:
        data["next"] = next_url
    return client.post(f"/versions/{version.pk}/actions/", data)


def test_it_shows_the_parsed_metadata_checksums_and_audit_trail(web_lena, v1):
    page = web_lena.get(f"/versions/{v1.pk}/").content.decode()
    assert "contracts v1" in page
    assert '<span class="chip">q_proj</span><span class="chip">v_proj</span>' in page
    assert f"{v1.tensor_count} tensors" in page
    for item in v1.files:
        assert item["sha256"] in page
    assert '<code>q_proj</code></td><td class="num">128</td>' in page
    assert "lora_alpha" in page  # the adapter_config.json table
    assert "version.registered" in page


def test_the_registrant_may_submit_but_not_review(web_lena, v1):
    assert buttons(web_lena.get(f"/versions/{v1.pk}/").content.decode()) == {
        "Submit for review": True
    }
    response = post_action(web_lena, v1, "submit")
    assert response.status_code == 302
    v1.refresh_from_db()
    assert v1.status == "pending_review"
    # A member sees no review buttons at all on a pending version.
    assert buttons(web_lena.get(f"/versions/{v1.pk}/").content.decode()) == {}


def test_a_member_who_posts_approve_anyway_is_refused_by_the_service(web_lena, lena, v1):
    version_transition(actor=actor(lena), version=v1, action="submit")
    response = post_action(web_lena, v1, "approve")
    assert response.status_code == 403
    assert b"Only an approver of this department" in response.content
    v1.refresh_from_db()
    assert v1.status == "pending_review"


def test_an_approver_approves_with_a_comment(web_alex, lena, v1):
    version_transition(actor=actor(lena), version=v1, action="submit")
    assert buttons(web_alex.get(f"/versions/{v1.pk}/").content.decode()) == {
        "Approve": True,
        "Reject": True,
    }
    response = post_action(web_alex, v1, "approve", comment="Looks right.")
    assert response.status_code == 302
    v1.refresh_from_db()
    assert (v1.status, v1.review_comment) == ("approved", "Looks right.")
    page = web_alex.get(f"/versions/{v1.pk}/").content.decode()
    assert "contracts v1 approved." in page
    assert "“Looks right.”" in page
    assert buttons(page) == {"Deprecate": True}


def test_a_reject_without_a_comment_says_a_comment_is_needed(web_alex, lena, v1):
    version_transition(actor=actor(lena), version=v1, action="submit")
    response = post_action(web_alex, v1, "reject")
    assert response.status_code == 400
    assert b"A comment is required to reject." in response.content
    v1.refresh_from_db()
    assert v1.status == "pending_review"


def test_approvers_cannot_review_their_own_work_and_are_told_why(web_alex, alex, contracts):
    own = make_version(alex, contracts, AdapterSpec(seed=11))
    version_transition(actor=actor(alex), version=own, action="submit")
    page = web_alex.get(f"/versions/{own.pk}/").content.decode()
    assert buttons(page) == {"Approve": False, "Reject": False}
    assert FOUR_EYES_VERSION in page

    response = post_action(web_alex, own, "approve")
    assert response.status_code == 403
    own.refresh_from_db()
    assert own.status == "pending_review"


def test_a_stale_action_names_the_current_state(web_alex, web_paula, lena, v1):
    version_transition(actor=actor(lena), version=v1, action="submit")
    post_action(web_paula, v1, "approve")
    response = post_action(web_alex, v1, "approve")
    assert response.status_code == 409
    assert b"it is approved" in response.content


def test_outsiders_get_404_and_cannot_act(web_fred, lena, v1):
    assert web_fred.get(f"/versions/{v1.pk}/").status_code == 404
    assert post_action(web_fred, v1, "submit").status_code == 404
    v1.refresh_from_db()
    assert v1.status == "registered"


def test_actions_are_posts(web_lena, v1):
    assert web_lena.get(f"/versions/{v1.pk}/actions/?action=submit").status_code == 405


def test_next_only_follows_local_urls(web_lena, v1):
    response = post_action(web_lena, v1, "submit", next_url="https://evil.example/")
    assert response["Location"] == f"/versions/{v1.pk}/"


def test_a_javascript_lineage_uri_is_never_a_link(web_lena, lena, contracts):
    from registry.services.versions import Lineage

    version = make_version(
        lena,
        contracts,
        AdapterSpec(seed=12),
        lineage=Lineage(mlflow_run_id="r1", mlflow_run_uri="javascript:alert(1)"),
    )
    page = web_lena.get(f"/versions/{version.pk}/").content.decode()
    assert 'href="javascript:' not in page


def test_its_query_count_does_not_grow_with_the_audit_trail(web_alex, lena, alex, legal, contracts):
    version = make_approved_version(lena, alex, contracts)
    url = f"/versions/{version.pk}/"
    small = query_count(web_alex, url)
    bulk_events(legal, lena, 120, "registry.adapterversion", str(version.pk))
    assert AuditEvent.objects.count() > 120
    large = query_count(web_alex, url)
    assert large == small
    # 11 for the registry; up to 6 more for its serving section (served on,
    # deployments and their allowed departments, pending promotions and the
    # department lookup that restricts them).
    assert large <= 17


def test_an_approved_version_with_no_lifecycle_action_points_to_its_promotion(
    web_lena, lena, alex, contracts
):
    """A member may not deprecate, but may promote: the page says so, not
    "nothing you can do" above a working Promote form."""
    version = make_approved_version(lena, alex, contracts)
    page = web_lena.get(f"/versions/{version.pk}/").content.decode()
    assert "There is nothing you can do" not in page
    assert '<a href="#serving">Promote it to a deployment</a>' in page
    assert "approved, not promoted" in page


def test_a_version_nobody_may_act_on_says_so(web_lena, lena, alex, contracts):
    version = make_approved_version(lena, alex, contracts)
    version_transition(actor=actor(alex), version=version, action="deprecate", comment="old")
    page = web_lena.get(f"/versions/{version.pk}/").content.decode()
    assert "There is nothing you can do with this version" in page
    assert "Promote it to a deployment" not in page
