"""The Adapters page: search and filters over the adapters the viewer may see,
each row saying what it serves where beside its newest approved version."""

from __future__ import annotations

import pytest

from serving.models import ServedAdapter
from tests.factories import make_adapter, make_approved_version, make_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.pages import bulk_adapters, query_count

pytestmark = pytest.mark.django_db


@pytest.fixture
def local_cpu(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9"], tmp_path / "volume", name="local-cpu")


@pytest.fixture
def served_v1_approved_v2(lena, alex, contracts, local_cpu):
    v1 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))
    v2 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=2))
    ServedAdapter.objects.create(deployment=local_cpu, adapter=contracts, version=v1)
    return v1, v2


def _page(client, query: str = "") -> str:
    response = client.get(f"/adapters/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_the_menu_links_to_the_adapters_page(web_lena):
    assert 'href="/adapters/"' in web_lena.get("/").content.decode()


def test_it_says_what_is_live_beside_what_is_approved(web_lena, served_v1_approved_v2):
    v1, v2 = served_v1_approved_v2
    page = _page(web_lena)
    assert f'serving <a href="/versions/{v1.pk}/">v1</a> on ' in page
    assert f'<a href="/versions/{v2.pk}/">v2</a> approved, not promoted' in page
    assert f'href="/versions/{v2.pk}/#serving">Promote</a>' in page


def test_an_adapter_serving_its_newest_approved_version_has_nothing_waiting(
    web_lena, lena, alex, contracts, local_cpu
):
    v1 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))
    ServedAdapter.objects.create(deployment=local_cpu, adapter=contracts, version=v1)
    page = _page(web_lena)
    assert "</a> approved, not promoted" not in page
    assert ">Promote</a>" not in page


def test_outsiders_never_see_another_departments_adapters(web_fred, served_v1_approved_v2):
    assert "contracts" not in _page(web_fred)
    # Not even by naming the department in a filter, or the adapter in a search.
    assert "contracts" not in _page(web_fred, "?department=legal")
    assert ">contracts</strong>" not in _page(web_fred, "?q=contracts")


def test_the_department_filter_offers_only_my_departments(web_lena, finance):
    page = _page(web_lena)
    assert '<option value="legal">Legal</option>' in page
    assert 'value="finance"' not in page


def test_it_searches_names_and_descriptions(web_lena, lena, legal, contracts):
    make_adapter(lena, legal, name="invoices", description="Reads supplier invoices.")
    page = _page(web_lena, "?q=supplier")
    assert "invoices" in page
    assert ">contracts<" not in page


def test_it_filters_by_base_model(web_lena, lena, legal, contracts):
    make_adapter(lena, legal, name="other", base_model="other-base")
    page = _page(web_lena, "?base_model=other-base")
    assert ">other<" in page
    assert ">contracts<" not in page


def test_it_filters_by_where_it_is_served(web_lena, lena, legal, served_v1_approved_v2):
    make_adapter(lena, legal, name="idle")
    served = _page(web_lena, "?served=local-cpu")
    assert ">contracts<" in served and ">idle<" not in served
    nowhere = _page(web_lena, "?served=-")
    assert ">idle<" in nowhere and ">contracts<" not in nowhere


@pytest.mark.parametrize(
    ("standing", "shown", "hidden"),
    [
        ("live", "contracts", "drafts"),
        ("unpromoted", "contracts", "drafts"),
        ("unapproved", "drafts", "contracts"),
        ("pending_review", "drafts", "contracts"),
    ],
)
def test_it_filters_by_status(
    web_lena, lena, legal, served_v1_approved_v2, standing, shown, hidden
):
    from registry.services.versions import version_transition
    from tests.conftest import actor

    drafts = make_adapter(lena, legal, name="drafts")
    version_transition(actor=actor(lena), version=make_version(lena, drafts), action="submit")
    page = _page(web_lena, f"?standing={standing}")
    assert f">{shown}<" in page
    assert f">{hidden}<" not in page


def test_an_unknown_filter_value_is_an_error_on_the_form_not_a_crash(web_lena, contracts):
    page = _page(web_lena, "?department=Legal")
    assert "Select a valid choice" in page
    assert ">contracts<" not in page


def test_pages_keep_the_filters(web_lena, lena, legal):
    bulk_adapters(legal, lena, 30)
    page = _page(web_lena, "?department=legal")
    assert 'href="?department=legal&amp;page=2"' in page


def test_its_query_count_does_not_grow_with_the_data(web_lena, lena, legal, local_cpu):
    bulk_adapters(legal, lena, 3)
    few = query_count(web_lena, "/adapters/")
    bulk_adapters(legal, lena, 20, prefix="more")
    many = query_count(web_lena, "/adapters/")
    assert many == few
