"""GET /api/v1/usage/ (and ?format=csv, and the /usage/ page): the daily rows
of the departments the caller sees, the requests and tokens they called or
that called their adapters, and each department's monthly GPU cost shared by
weighted tokens (by requests where replicas report none). Outsiders get 404
for a department they do not see."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import DailyTokens, DailyUsage
from serving.models import Replica
from serving.services.inference_keys import inference_key_issue
from tests.conftest import actor
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
    # Legal made 30 of the deployment's 40 requests: 75 %, told as a quarter. The
    # figure (2190 of 2920 a month) would give Finance's 10 requests: 30 x 2920 / 2190 - 30.
    (cost,) = body["costs"]
    assert cost == {
        "department": "legal",
        "requests": 30,
        "called_requests": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
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
    assert numbers == {30, 0, 1, 1460.0}  # requests, tokens, use cases, dedicated: its own
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


@pytest.fixture
def calls(usage, root, legal, finance, approved_v1, deployment):
    """vLLM's counts today on the same deployment (weights 1 and 3): Legal's key
    calls Legal's adapter (1000 + 3 x 100 = 1300), Finance's key calls it
    through a grant (500 + 3 x 300 = 1400) and the base model (200 + 3 x 100 =
    500), and an open door's caller sends 100 prompt tokens: 3300 in all."""
    keys = {
        slug: inference_key_issue(
            actor=actor(root), department=department, name="k", expires_in_days=3
        )[0]
        for slug, department in (("legal", legal), ("finance", finance))
    }
    today = timezone.now().date()

    def row(key, version, requests, prompt, completion):
        adapter = version.adapter if version else None
        DailyTokens.objects.create(
            day=today,
            deployment=deployment,
            key_ref=key.pk if key else 0,
            version_ref=version.pk if version else 0,
            key=key,
            department=key.department if key else None,
            owner=adapter.department if adapter else None,
            adapter=adapter,
            version=version,
            served_name=adapter.served_name if adapter else "tiny-llama",
            version_number=version.number if version else 0,
            requests=requests,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )

    row(keys["legal"], approved_v1, 10, 1000, 100)
    row(keys["finance"], approved_v1, 5, 500, 300)
    row(keys["finance"], None, 2, 200, 100)
    row(None, None, 1, 100, 0)
    return keys


def test_the_cost_is_split_by_the_weighted_tokens_each_department_called(as_root, calls):
    body = as_root.get("/api/v1/usage/").json()
    assert (body["prompt_token_weight"], body["completion_token_weight"]) == (1.0, 3.0)
    costs = {c["department"]: c for c in body["costs"]}
    # 2920 a month: Legal 1300/3300, Finance 1900/3300; the open door's 100 is nobody's.
    assert costs["legal"]["shared_monthly_cost"] == round(2920 * 1300 / 3300, 2)
    assert costs["finance"]["shared_monthly_cost"] == round(2920 * 1900 / 3300, 2)
    assert (costs["finance"]["called_requests"], costs["finance"]["prompt_tokens"]) == (7, 700)
    assert costs["finance"]["completion_tokens"] == 400
    assert {d: c["cost_share"] for d, c in costs.items()} == {
        "finance": "50–75%",
        "legal": "25–50%",
    }
    # Everything, the caller without a key included.
    assert sorted(
        (c["calling_department"] or "-", c["served_name"], c["tokens"]) for c in body["calls"]
    ) == [
        ("-", "tiny-llama", 100),
        ("finance", "legal-contracts", 800),
        ("finance", "tiny-llama", 300),
        ("legal", "legal-contracts", 1100),
    ]


def test_the_weights_are_a_setting(as_root, calls, settings):
    settings.SERVING_COST_COMPLETION_TOKEN_WEIGHT = 1.0
    costs = {c["department"]: c for c in as_root.get("/api/v1/usage/").json()["costs"]}
    # 1100, 800 + 300 and 100 tokens: 2300 in all.
    assert costs["legal"]["shared_monthly_cost"] == round(2920 * 1100 / 2300, 2)


def test_a_member_sees_who_called_their_adapters_and_what_their_keys_called(as_lena, calls):
    body = as_lena.get("/api/v1/usage/").json()
    assert sorted(
        (c["calling_department"], c["owning_department"], c["served_name"], c["requests"])
        for c in body["calls"]
    ) == [
        ("finance", "legal", "legal-contracts", 5),
        ("legal", "legal", "legal-contracts", 10),
    ]
    (cost,) = body["costs"]
    assert cost["cost_share"] == "25–50%" and cost["shared_monthly_cost"] is None
    numbers = {v for v in cost.values() if isinstance(v, int | float)}
    assert numbers == {30, 10, 1000, 100, 1, 1460.0}  # all its own


def test_another_department_sees_its_own_calls_only(as_fred, calls):
    body = as_fred.get("/api/v1/usage/").json()
    assert sorted((c["calling_department"], c["served_name"]) for c in body["calls"]) == [
        ("finance", "legal-contracts"),
        ("finance", "tiny-llama"),
    ]


def test_csv_export(as_lena, calls, approved_v1):
    response = as_lena.get("/api/v1/usage/?format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    today = timezone.now().date().isoformat()
    line = {
        "day": today,
        "owning_department": "legal",
        "deployment": "staging-cpu",
        "served_name": "legal-contracts",
        "version_number": str(approved_v1.number),
    }
    assert rows == [
        {
            **line,
            "calling_department": "finance",
            "key": str(calls["finance"].pk),
            "requests": "5",
            "prompt_tokens": "500",
            "completion_tokens": "300",
        },
        {
            **line,
            "calling_department": "legal",
            "key": str(calls["legal"].pk),
            "requests": "10",
            "prompt_tokens": "1000",
            "completion_tokens": "100",
        },
    ]


def test_the_usage_page_shows_tokens_by_who_called(web_lena, calls, approved_v1):
    page = web_lena.get("/usage/").content.decode()
    start = page.index(f'data-testid="calls-finance-legal-contracts-v{approved_v1.number}"')
    row = page[start : page.index("</tr>", start)]
    assert ">5<" in row and ">500<" in row and ">300<" in row
    cost = page[page.index('data-testid="cost-legal"') :]
    assert "1000 + 100" in cost[: cost.index("</tr>")]


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
