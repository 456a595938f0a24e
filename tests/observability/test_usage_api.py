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


def test_a_member_sees_their_department_s_rows_and_cost_as_a_share(as_lena, usage):
    body = as_lena.get("/api/v1/usage/").json()
    assert [
        (r["served_name"], r["requests"], r["errors_4xx"], r["errors_5xx"]) for r in body["rows"]
    ] == [("legal-contracts", 30, 2, 1)]
    assert body["rows"][0]["tokens"] is None and "no adapter label" in body["tokens_unavailable"]
    # Legal made 30 of the deployment's 40 requests: 75 %, told as a quarter. The
    # figure (2190 of 2920 a month) would give Finance's 10 requests: 30 x 2920 / 2190 - 30.
    (cost,) = body["costs"]
    assert cost == {
        "department": "legal",
        "requests": 30,
        "use_cases": 1,
        "shared_monthly_cost": None,
        "cost_share": "50–75%",
        "dedicated_monthly_cost": 1460.0,
        "monthly_saving": None,
    }


@pytest.mark.parametrize("who", ["as_lena", "as_alex", "as_token"])
def test_nothing_a_member_reads_gives_other_departments_totals(who, usage, request):
    """Their own requests (30) and the deployment's GPU cost (2920, from what they
    see of the deployment) are known to them; no figure in the answer may turn
    into Finance's 10 requests or the deployment's 40."""
    body = request.getfixturevalue(who).get("/api/v1/usage/").json()
    (cost,) = body["costs"]
    assert cost["shared_monthly_cost"] is None and cost["monthly_saving"] is None
    numbers = {v for v in cost.values() if isinstance(v, int | float)}
    assert numbers == {30, 1, 1460.0}  # requests, use cases, dedicated: none of others'
    assert cost["cost_share"] == "50–75%"


def test_a_platform_admin_sees_every_department_with_figures(as_root, usage):
    body = as_root.get("/api/v1/usage/").json()
    assert sorted(r["department"] for r in body["rows"]) == ["finance", "legal"]
    costs = {c["department"]: c for c in body["costs"]}
    assert {d: c["shared_monthly_cost"] for d, c in costs.items()} == {
        "finance": 730.0,
        "legal": 2190.0,
    }
    assert costs["legal"]["monthly_saving"] == -730.0
    assert {d: c["cost_share"] for d, c in costs.items()} == {
        "finance": "0–25%",
        "legal": "50–75%",
    }


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
    cost = cost[: cost.index("</tr>")]
    assert "50–75%" in cost and "admins only" in cost and "USD\xa01,460.00" in cost
    # Neither the shared cost nor the saving, in figures or in words.
    assert "2,190" not in page and "730.00" not in page and "cost-note-legal" not in page
    assert "finance-ledger" not in page


def test_the_usage_page_explains_a_negative_saving_in_words_to_a_platform_admin(
    web_root, usage, settings
):
    settings.COST_CURRENCY = "EUR"
    page = web_root.get("/usage/?department=legal").content.decode()
    row = page[page.index('data-testid="cost-legal"') :]
    # 2 GPUs shared, 30 of 40 requests, one use case: 2,190 shared against 1,460 dedicated.
    row = row[: row.index("</tr>")]
    assert "EUR\xa02,190.00" in row and "\u2212EUR\xa0730.00" in row and "50–75%" in row
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
