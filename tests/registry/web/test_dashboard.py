import re

import pytest

from registry.models import VersionStatus
from tests.factories import make_approved_version, make_version
from tests.support.pages import bulk_adapters, bulk_events, clone_versions, query_count

pytestmark = pytest.mark.django_db


def test_it_lists_my_departments_and_adapters_with_the_approved_version_not_yet_live(
    web_lena, lena, alex, legal, contracts
):
    approved = make_approved_version(lena, alex, contracts)
    make_version(lena, contracts)  # v2, not approved: the dashboard still shows v1

    page = web_lena.get("/").content.decode()

    assert "Legal · member" in page
    assert f'href="/adapters/{contracts.pk}/"' in page
    # Approved is not live: the row says both, and offers the promotion.
    assert (
        f'<span class="muted">not served</span> · <a href="/versions/{approved.pk}/">v1</a> '
        "approved, not promoted"
    ) in page
    assert f'href="/versions/{approved.pk}/#serving">Promote</a>' in page
    assert ">v2</a> approved" not in page


def test_it_shows_recent_activity_from_the_audit_log(web_lena, contracts, v1):
    page = web_lena.get("/").content.decode()
    assert "version.registered" in page
    assert f'href="/versions/{v1.pk}/"' in page
    # The date, time and zone, with the relative time on hover ("now",
    # "20 seconds ago", or "a minute ago" when a starved run took that long).
    assert "\xa0UTC</time>" in page
    assert re.search(r'<time datetime="[^"]+" title="(now|[^"]+ ago)">', page)


def test_it_counts_my_pending_reviews(web_alex, lena, contracts, v1):
    from registry.services.versions import version_transition
    from tests.conftest import actor

    version_transition(actor=actor(lena), version=v1, action="submit")
    page = web_alex.get("/").content.decode()
    assert 'data-testid="pending-count">1</a>' in page


def test_a_member_is_told_they_approve_nowhere(web_lena):
    assert b"You approve in no department." in web_lena.get("/").content


def test_outsiders_do_not_see_other_departments_adapters(web_fred, contracts, v1):
    page = web_fred.get("/").content.decode()
    assert "contracts" not in page
    assert "version.registered" not in page


def test_adapters_paginate(web_lena, lena, legal):
    bulk_adapters(legal, lena, 45)
    first = web_lena.get("/").content.decode()
    assert "Page 1 of 3" in first
    assert "45 in all" in first
    assert "Page 3 of 3" in web_lena.get("/?page=3").content.decode()


def test_its_query_count_does_not_grow_with_the_data(
    web_lena, web_alex, lena, alex, legal, contracts, finance, fred
):
    approved = make_approved_version(lena, alex, contracts)
    small = query_count(web_lena, "/"), query_count(web_alex, "/")

    for adapter in bulk_adapters(legal, lena, 200):
        clone_versions(approved, adapter, 2, VersionStatus.APPROVED)
    clone_versions(approved, contracts, 30, VersionStatus.PENDING_REVIEW)
    bulk_adapters(finance, fred, 50, prefix="fin")
    bulk_events(legal, lena, 100, "registry.adapter", str(contracts.pk))

    large = query_count(web_lena, "/"), query_count(web_alex, "/")
    assert large == small
    # 15, and one for the unread notifications badge in the navigation.
    assert max(large) <= 16
