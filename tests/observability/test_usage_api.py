"""GET /api/v1/usage/ (and ?format=csv, and the /usage/ page): the daily rows
of the departments the caller sees, and each department's monthly GPU cost
shared by its requests. Outsiders get 404 for a department they do not see."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import DailyUsage
from serving.models import Replica
from tests.factories import make_adapter, make_version
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def usage(deployment, approved_v1, finance, fred, settings):
    """Legal: 30 requests (2 4xx, 1 5xx) today; Finance: 10 yesterday; on a
    deployment of 2 one-GPU replicas at 2.00 per GPU-hour."""
    settings.PLANNER_PRICE_PER_GPU_HOUR = 2.0
    deployment.replicas.all().delete()
    for port in (1, 2):
        Replica.objects.create(deployment=deployment, base_url=f"http://127.0.0.1:{port}")
    deployment.gpus = 1
    deployment.save(update_fields=["gpus"])
    ledger = make_adapter(fred, finance, name="ledger", served_name="finance-ledger")
    ledger_v1 = make_version(fred, ledger, AdapterSpec(seed=9))
    today = timezone.now().date()
    legal_row = DailyUsage.objects.create(
        day=today,
        deployment=deployment,
        department=approved_v1.adapter.department,
        adapter=approved_v1.adapter,
        served_name="legal-contracts",
        version=approved_v1,
        version_number=approved_v1.number,
        requests=30,
        errors_4xx=2,
        errors_5xx=1,
    )
    DailyUsage.objects.create(
        day=today - timedelta(days=1),
        deployment=deployment,
        department=finance,
        adapter=ledger,
        served_name="finance-ledger",
        version=ledger_v1,
        version_number=ledger_v1.number,
        requests=10,
    )
    return legal_row


def test_a_member_sees_their_department_s_rows_and_cost(as_lena, usage):
    body = as_lena.get("/api/v1/usage/").json()
    assert [
        (r["served_name"], r["requests"], r["errors_4xx"], r["errors_5xx"]) for r in body["rows"]
    ] == [("legal-contracts", 30, 2, 1)]
    assert body["rows"][0]["tokens"] is None and "no adapter label" in body["tokens_unavailable"]
    # 2 GPUs x 2.00 x 730 h = 2920 a month, Legal made 30 of the deployment's 40 requests.
    (cost,) = body["costs"]
    assert cost == {
        "department": "legal",
        "requests": 30,
        "use_cases": 1,
        "shared_monthly_cost": 2190.0,
        "dedicated_monthly_cost": 1460.0,
        "monthly_saving": -730.0,
    }


def test_a_platform_admin_sees_every_department(as_root, usage):
    body = as_root.get("/api/v1/usage/").json()
    assert sorted(r["department"] for r in body["rows"]) == ["finance", "legal"]
    shares = {c["department"]: c["shared_monthly_cost"] for c in body["costs"]}
    assert shares == {"finance": 730.0, "legal": 2190.0}


def test_an_outsider_gets_404_for_a_department_they_do_not_see(as_fred, usage):
    response = as_fred.get("/api/v1/usage/?department=legal")
    assert response.status_code == 404
    assert as_fred.get("/api/v1/usage/?department=nowhere").status_code == 404
    rows = as_fred.get("/api/v1/usage/").json()["rows"]
    assert [r["department"] for r in rows] == ["finance"]


def test_the_period_filters_the_rows(as_root, usage):
    today = timezone.now().date()
    body = as_root.get(f"/api/v1/usage/?from={today}&to={today}").json()
    assert [r["department"] for r in body["rows"]] == ["legal"]
    assert body["start"] == body["end"] == today.isoformat()


@pytest.mark.parametrize(
    "query,field",
    [
        ("from=yesterday", "from"),
        ("to=2026-13-01", "to"),
        ("from=2026-02-01&to=2026-01-01", "from"),
        ("from=2020-01-01&to=2026-01-01", "from"),
    ],
)
def test_a_bad_period_is_a_400_that_names_it(as_lena, usage, query, field):
    response = as_lena.get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400
    assert field in response.json()["error"]["details"]["fields"], response.json()


def test_csv_export(as_lena, usage):
    response = as_lena.get("/api/v1/usage/?format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows == [
        {
            "day": usage.day.isoformat(),
            "department": "legal",
            "deployment": "staging-cpu",
            "served_name": "legal-contracts",
            "version_number": str(usage.version_number),
            "requests": "30",
            "errors_4xx": "2",
            "errors_5xx": "1",
        }
    ]


def test_the_usage_page_shows_rows_and_cost(web_lena, usage):
    page = web_lena.get("/usage/").content.decode()
    start = page.index(f'data-testid="usage-legal-contracts-v{usage.version_number}"')
    row = page[start : page.index("</tr>", start)]
    assert ">30<" in row and ">2<" in row and ">1<" in row
    cost = page[page.index('data-testid="cost-legal"') :]
    assert "USD\xa02,190.00" in cost[: cost.index("</tr>")]
    assert "finance-ledger" not in page


def test_the_usage_page_explains_a_negative_saving_in_words(web_lena, usage, settings):
    settings.COST_CURRENCY = "EUR"
    page = web_lena.get("/usage/").content.decode()
    row = page[page.index('data-testid="cost-legal"') :]
    # 2 GPUs shared, 30 of 30 requests, one use case: 2,190 shared against 1,460 dedicated.
    assert "\u2212EUR\xa0730.00" in row[: row.index("</tr>")]
    note = page[page.index('data-testid="cost-note-legal"') :]
    assert "Legal pays EUR\xa0730.00 a month more shared than dedicated" in note
    assert "per GPU-hour" in page and "EUR\xa02.00" in page


def test_the_usage_page_picks_a_department_from_a_list_and_totals_the_costs(
    web_root, usage, settings
):
    page = web_root.get("/usage/").content.decode()
    assert '<select id="department" name="department">' in page
    assert '<option value="legal" >Legal</option>' in page
    assert '<option value="finance" >Finance</option>' in page
    total = page[page.index('data-testid="cost-total"') :]
    total = total[: total.index("</tr>")]
    # The deployment's 2 GPUs x 2.00 x 730 h, split 30:10 between Legal and Finance.
    assert ">40<" in total
    assert "USD\xa02,920.00" in total


def test_the_department_picker_keeps_the_chosen_one(web_lena, usage):
    page = web_lena.get("/usage/?department=legal").content.decode()
    assert '<option value="legal" selected>Legal</option>' in page
    assert 'value="finance"' not in page


def test_the_usage_page_404s_for_an_outsider_s_department(web_fred, usage):
    assert web_fred.get("/usage/?department=legal").status_code == 404
