import pytest

from tests.support.pages import bulk_events, query_count

pytestmark = pytest.mark.django_db


def test_it_pages_through_my_departments_audit_log(web_lena, lena, legal, contracts):
    bulk_events(legal, lena, 60, "registry.adapter", str(contracts.pk))
    page = web_lena.get("/activity/").content.decode()
    assert "Page 1 of 2" in page
    assert f'href="/adapters/{contracts.pk}/">event 59</a>' in page


def test_outsiders_see_none_of_it(web_fred, lena, legal, contracts):
    bulk_events(legal, lena, 3, "registry.adapter", str(contracts.pk))
    assert b"event 0" not in web_fred.get("/activity/").content


def test_its_query_count_does_not_grow_with_the_log(web_lena, lena, legal, contracts):
    small = query_count(web_lena, "/activity/")
    bulk_events(legal, lena, 200, "registry.adapter", str(contracts.pk))
    assert query_count(web_lena, "/activity/") == small
