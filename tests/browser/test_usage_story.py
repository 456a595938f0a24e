"""The usage page in a real browser: a Legal member reads their department's
requests and cost for a period, is told clearly when the period is wrong, and
downloads the same rows as CSV; a Finance member sees only Finance's. The
counting itself (from the front door's counters, after each reconcile) is
tested against a real HAProxy in tests/observability/test_usage_through_haproxy.py;
here the rows are written directly."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import DailyTokens, DailyUsage
from serving.models import InferenceKey, Replica
from tests.browser.conftest import TABLET
from tests.browser.test_story import no_horizontal_scroll, sign_in
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def usage(root, lena, alex, fred, legal, finance, settings, tmp_path):
    settings.PLANNER_PRICE_PER_GPU_HOUR = 2.0
    deployment = make_deployment(root, ["http://127.0.0.1:1"], tmp_path / "volume")
    Replica.objects.create(deployment=deployment, base_url="http://127.0.0.1:2")
    contracts = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    contracts_v1 = make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))
    ledger = make_adapter(fred, finance, name="ledger", served_name="finance-ledger")
    today = timezone.now().date()
    for day, requests, errors_4xx in ((today, 30, 2), (today - timedelta(days=3), 12, 0)):
        DailyUsage.objects.create(
            day=day,
            deployment=deployment,
            department=legal,
            adapter=contracts,
            served_name="legal-contracts",
            version=contracts_v1,
            version_number=contracts_v1.number,
            requests=requests,
            errors_4xx=errors_4xx,
        )
    DailyUsage.objects.create(
        day=today,
        deployment=deployment,
        department=finance,
        adapter=ledger,
        served_name="finance-ledger",
        requests=10,
    )
    # What vLLM counted for the same requests, all of them by a key of Legal.
    key = InferenceKey.objects.create(
        department=legal,
        name="k",
        prefix="sk-x",
        secret_sha256="0" * 64,
        created_by=root,
        expires_at=timezone.now() + timedelta(days=1),
    )
    for day, requests in ((today, 30), (today - timedelta(days=3), 12)):
        DailyTokens.objects.create(
            day=day,
            deployment=deployment,
            key_ref=key.pk,
            version_ref=contracts_v1.pk,
            key=key,
            department=legal,
            owner=legal,
            adapter=contracts,
            version=contracts_v1,
            served_name="legal-contracts",
            version_number=contracts_v1.number,
            requests=requests,
            prompt_tokens=requests * 9,
            completion_tokens=requests,
        )
    return today


def test_a_member_reads_their_period_is_told_of_a_wrong_one_and_downloads_csv(
    new_page, screenshot, usage
):
    today = usage
    page = new_page()
    sign_in(page, "lena")
    page.goto("/usage/")

    rows = page.get_by_test_id("usage-rows")
    legal = rows.get_by_test_id("usage-legal-contracts-v1")
    assert legal.count() == 2
    legal_today = legal.filter(has_text=today.isoformat())
    assert legal_today.get_by_test_id("requests").inner_text() == "30"
    assert legal_today.get_by_test_id("errors-4xx").inner_text() == "2"
    assert "finance-ledger" not in rows.inner_text()
    assert page.get_by_test_id("cost-legal").is_visible()
    assert page.get_by_test_id("cost-finance").count() == 0

    # The last two days only: the row of three days ago drops out.
    page.get_by_label("From", exact=True).fill((today - timedelta(days=1)).isoformat())
    page.get_by_label("To", exact=True).fill(today.isoformat())
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/usage/?*")
    assert rows.locator("tbody tr").count() == 1
    screenshot(page, "usage-member")

    # From after To: the page says which field is wrong, and shows no figures.
    page.get_by_label("From", exact=True).fill(today.isoformat())
    page.get_by_label("To", exact=True).fill((today - timedelta(days=2)).isoformat())
    page.get_by_role("button", name="Show").click()
    page.wait_for_load_state()
    assert page.locator("p.reason").first.is_visible()
    assert page.get_by_test_id("usage-rows").count() == 0

    # The CSV link carries the period shown and answers the same rows.
    page.get_by_label("From", exact=True).fill((today - timedelta(days=7)).isoformat())
    page.get_by_label("To", exact=True).fill(today.isoformat())
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/usage/?*")
    href = page.get_by_test_id("usage-csv").get_attribute("href")
    answer = page.request.get(href)
    assert answer.status == 200
    body = list(csv.DictReader(io.StringIO(answer.text())))
    assert sorted(int(r["requests"]) for r in body) == [12, 30]
    assert {r["served_name"] for r in body} == {"legal-contracts"}


def test_another_department_sees_only_its_own_and_the_page_fits_a_tablet(new_page, usage):
    page = new_page(viewport=TABLET)
    sign_in(page, "fred")
    page.goto("/usage/")
    rows = page.get_by_test_id("usage-rows").inner_text()
    assert "finance-ledger" in rows
    assert "legal-contracts" not in rows
    assert page.get_by_test_id("cost-legal").count() == 0
    assert no_horizontal_scroll(page)
