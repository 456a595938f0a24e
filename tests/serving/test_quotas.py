"""Limits (serving/rules/quotas.py, serving/services/limits.py): which callers the
doors refuse for tokens, from "tokens per key and department over a window"
(the pure side from usage rows given here; the database side from metered
requests written directly, as metering writes them); who sets which limit, the
bounds, the audit, the API and the page; and what reaches the door's maps.
The door's side on a real HAProxy: test_door_limits.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest

from core.errors import Conflict, NotAuthorized, NotFound, ValidationFailed
from core.models import AuditEvent
from serving.door.haproxy.maps import access_maps
from serving.door.selectors import door_access
from serving.models import DepartmentLimits
from serving.rules.quotas import (
    DepartmentLimitsView,
    KeyLimits,
    Limited,
    Windows,
    budgets_left,
    door_rpm,
    limited_callers,
)
from serving.services.inference_keys import inference_key_issue, inference_key_revoke
from serving.services.limits import department_limits_set, inference_key_limits_set
from tests.conftest import actor
from tests.serving.conftest import make_deployment

# 2026-12-31 23:59:30 UTC: the minute, the day and the month all end 30 s later.
NOW = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC)


def usage(rows):
    """Tokens per scope and window from usage rows (when, key id, department,
    tokens), as metering answers: the seam `TokensOver`."""

    def tokens(scope, since, until):
        found: dict = {}
        for at, key_id, department, count in rows:
            if since <= at <= until:
                who = key_id if scope == "key" else department
                found[who] = found.get(who, 0) + count
        return found

    return tokens


# -- the pure side --------------------------------------------------------------------


def test_the_windows_are_the_utc_calendar_minute_day_and_month():
    windows = Windows.at(datetime(2027, 2, 14, 10, 5, 7, tzinfo=UTC))
    assert windows.minute == (
        datetime(2027, 2, 14, 10, 5, tzinfo=UTC),
        datetime(2027, 2, 14, 10, 6, tzinfo=UTC),
    )
    assert windows.day[1] == datetime(2027, 2, 15, tzinfo=UTC)
    assert windows.month == (datetime(2027, 2, 1, tzinfo=UTC), datetime(2027, 3, 1, tzinfo=UTC))


def test_a_key_past_its_tokens_per_minute_is_limited_until_the_minute_ends():
    start = datetime(2027, 2, 14, 10, 5, 0, tzinfo=UTC)
    now = start + timedelta(seconds=20)
    rows = [
        (start + timedelta(seconds=1), 1, "legal", 600),
        (start + timedelta(seconds=9), 1, "legal", 400),
        (start - timedelta(seconds=5), 2, "legal", 5000),  # the minute before
        (start + timedelta(seconds=3), 2, "legal", 999),
    ]
    keys = {1: KeyLimits("legal", tokens_per_minute=1000), 2: KeyLimits("legal", None, 1000)}

    found = limited_callers(keys=keys, departments={}, tokens=usage(rows), now=now)

    assert found == {
        "key:1": Limited(int((start + timedelta(minutes=1)).timestamp()), "tokens_per_minute", 1000)
    }


def test_a_department_past_its_day_budget_is_limited_until_midnight_utc():
    rows = [(NOW - timedelta(hours=3), 1, "legal", 70), (NOW - timedelta(hours=1), 2, "legal", 30)]
    rows.append((NOW - timedelta(days=1), 1, "finance", 10_000))  # yesterday
    departments = {
        "legal": DepartmentLimitsView(tokens_per_day=100),
        "finance": DepartmentLimitsView(tokens_per_day=100),
    }
    found = limited_callers(keys={}, departments=departments, tokens=usage(rows), now=NOW)
    midnight = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    assert found == {"dept:legal": Limited(midnight, "tokens_per_day", 100)}


def test_of_several_limits_crossed_the_one_that_ends_last_is_kept():
    now = datetime(2027, 2, 14, 10, 5, 20, tzinfo=UTC)
    rows = [(now - timedelta(seconds=5), 1, "legal", 10_000)]
    departments = {
        "legal": DepartmentLimitsView(
            tokens_per_minute=100, tokens_per_day=5000, tokens_per_month=9000
        )
    }
    found = limited_callers(keys={}, departments=departments, tokens=usage(rows), now=now)
    assert found["dept:legal"] == Limited(
        int(datetime(2027, 3, 1, tzinfo=UTC).timestamp()), "tokens_per_month", 9000
    )


def test_nothing_metered_limits_nobody_and_metering_is_asked_only_where_a_limit_exists():
    asked = []

    def nothing(scope, since, until):
        asked.append((scope, since))
        return None

    departments = {"legal": DepartmentLimitsView(requests_per_minute=5, tokens_per_day=10)}
    found = limited_callers(
        keys={1: KeyLimits("legal", requests_per_minute=3)},
        departments=departments,
        tokens=nothing,
        now=NOW,
    )
    assert found == {}
    assert asked == [("department", datetime(2026, 12, 31, tzinfo=UTC))]


def test_the_door_counts_requests_per_minute_only_where_a_limit_is_set():
    rpm = door_rpm(
        {1: KeyLimits("legal", 10), 2: KeyLimits("legal", None, 500)},
        {"legal": DepartmentLimitsView(requests_per_minute=60), "ops": DepartmentLimitsView()},
    )
    assert rpm == {"key:1": 10, "dept:legal": 60}


def test_what_is_left_of_each_budget_and_when_it_renews():
    rows = [(NOW - timedelta(hours=1), 1, "legal", 700)]
    limits = DepartmentLimitsView(tokens_per_day=1000, tokens_per_month=5000)
    day, month = budgets_left("legal", limits, usage(rows), NOW)
    assert (day.limit, day.used, day.left) == ("tokens_per_day", 700, 300)
    assert (month.limit, month.left) == ("tokens_per_month", 4300)
    assert day.resets_at == month.resets_at == datetime(2027, 1, 1, tzinfo=UTC)
    unmetered = budgets_left("legal", limits, lambda *_: None, NOW)
    assert [(b.used, b.left) for b in unmetered] == [(None, None), (None, None)]


def test_the_door_s_maps_hold_the_limits_and_the_refused_callers():
    from serving.door.callers import DoorAccess

    maps = access_maps(
        DoorAccess(
            deployment="gw",
            rpm={"key:1": 10, "dept:legal": 60},
            limited={"dept:legal": Limited(1767225600, "tokens_per_day", 100)},
        )
    )
    assert maps["rpm"] == {"key:1": "10", "dept:legal": "60"}
    assert maps["limited"] == {"dept:legal": "1767225600|tokens_per_day|100"}
    # A change of either is a new fingerprint: the next sync pushes it.
    other = access_maps(DoorAccess(deployment="gw", rpm={"key:1": 11}))
    assert other["door"]["fingerprint"] != maps["door"]["fingerprint"]


# -- services -------------------------------------------------------------------------


def mark_metered(deployment) -> None:
    """As a span marks its deployment: metered only once spans arrive."""
    from django.utils import timezone

    from observability.models import MeteringState

    MeteringState.objects.update_or_create(
        deployment=deployment, defaults={"last_span_at": timezone.now()}
    )


def metered(deployment, key, tokens: int, *, at: datetime) -> None:
    """A request as metering records it (observability.metering): one row, and
    its deployment marked metered."""
    from observability.models import MeteredRequest

    mark_metered(deployment)
    MeteredRequest.objects.create(
        request_id=f"u1.k{key.pk}.v0.{MeteredRequest.objects.count()}",
        deployment=deployment,
        finished_at=at,
        key=key,
        department=key.department,
        prompt_tokens=tokens // 2,
        completion_tokens=tokens - tokens // 2,
    )


@pytest.fixture
def key(alex, legal):
    issued, _ = inference_key_issue(
        actor=actor(alex), department=legal, name="batch", expires_in_days=30
    )
    return issued


@pytest.mark.django_db
def test_a_platform_admin_sets_a_department_s_limits_audited_and_sent_to_every_door(
    root, legal, door_syncs, tmp_path
):
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "v")
    with door_syncs() as sent:
        limits = department_limits_set(
            actor=actor(root),
            department=legal,
            changes={"requests_per_minute": 600, "tokens_per_day": 10_000},
        )
    assert sent == [deployment.pk]
    assert (limits.requests_per_minute, limits.tokens_per_day, limits.tokens_per_month) == (
        600,
        10_000,
        None,
    )
    event = AuditEvent.objects.get(action="department_limits.changed")
    assert event.department_id == legal.pk and event.actor_id == root.pk
    assert event.details["before"]["requests_per_minute"] is None
    assert event.details["after"]["requests_per_minute"] == 600
    assert door_access(deployment).rpm == {"dept:legal": 600}


@pytest.mark.django_db
def test_only_platform_admins_set_a_department_s_limits(alex, fred, legal):
    with pytest.raises(NotAuthorized):
        department_limits_set(actor=actor(alex), department=legal, changes={"tokens_per_day": 1})
    with pytest.raises(NotFound):
        department_limits_set(actor=actor(fred), department=legal, changes={"tokens_per_day": 1})
    assert not DepartmentLimits.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"requests_per_minute": 0}, "requests_per_minute must be a whole number from 1"),
        ({"tokens_per_day": -5}, "tokens_per_day must be a whole number from 1"),
        ({"tokens_per_month": "100"}, "tokens_per_month must be a whole number"),
        ({"tokens_per_month": True}, "tokens_per_month must be a whole number"),
        ({"requests_per_minute": 10**9}, "from 1 to 10000000"),
        ({"rpm": 5}, "Unknown limit rpm"),
        ({"tokens_per_day": 100, "tokens_per_month": 50}, "above tokens_per_month (50)"),
    ],
)
def test_a_bad_department_limit_is_refused_naming_the_problem(root, legal, changes, problem):
    with pytest.raises(ValidationFailed) as refused:
        department_limits_set(actor=actor(root), department=legal, changes=changes)
    assert problem in refused.value.message
    assert not AuditEvent.objects.filter(action="department_limits.changed").exists()


@pytest.mark.django_db
def test_an_approver_sets_a_key_s_limits_never_above_the_department_s(root, alex, legal, key):
    department_limits_set(actor=actor(root), department=legal, changes={"requests_per_minute": 100})
    with pytest.raises(ValidationFailed) as refused:
        inference_key_limits_set(actor=actor(alex), key=key, changes={"requests_per_minute": 101})
    assert refused.value.code == "above_department_limit"

    key = inference_key_limits_set(
        actor=actor(alex), key=key, changes={"requests_per_minute": 100, "tokens_per_minute": 7}
    )
    assert (key.requests_per_minute, key.tokens_per_minute) == (100, 7)
    event = AuditEvent.objects.get(action="inference_key.limits_changed")
    assert event.details["after"] == {"requests_per_minute": 100, "tokens_per_minute": 7}
    assert event.details["prefix"] == key.prefix


@pytest.mark.django_db
def test_a_member_a_token_and_an_outsider_may_not_set_a_key_s_limits(lena, fred, legal_token, key):
    for who, token in ((lena, None), (fred, None), (lena, legal_token)):
        with pytest.raises(NotAuthorized):
            inference_key_limits_set(
                actor=actor(who, token), key=key, changes={"requests_per_minute": 1}
            )


@pytest.mark.django_db
def test_a_revoked_key_s_limits_are_not_changed(alex, key):
    inference_key_revoke(actor=actor(alex), key=key)
    with pytest.raises(Conflict):
        inference_key_limits_set(actor=actor(alex), key=key, changes={"requests_per_minute": 1})


@pytest.mark.django_db
def test_the_door_s_table_lists_key_limits_and_the_callers_metering_says_are_over(
    root, alex, legal, key, tmp_path
):
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "v")
    inference_key_limits_set(
        actor=actor(alex), key=key, changes={"requests_per_minute": 5, "tokens_per_minute": 100}
    )
    department_limits_set(actor=actor(root), department=legal, changes={"tokens_per_day": 1000})
    assert door_access(deployment).limited == {}  # nothing used yet
    metered(deployment, key, 150, at=datetime.now(UTC))

    access = door_access(deployment)

    assert access.rpm == {f"key:{key.pk}": 5}
    assert set(access.limited) == {f"key:{key.pk}"}
    assert access.limited[f"key:{key.pk}"].limit == "tokens_per_minute"
    # Nothing meters tokens (no reader): unknown, which limits nobody.
    with mock.patch("serving.token_usage._readers", []):
        assert door_access(deployment).limited == {}


@pytest.mark.django_db
def test_a_department_past_its_day_budget_is_limited_from_metered_requests(
    root, alex, legal, key, tmp_path
):
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "v")
    department_limits_set(actor=actor(root), department=legal, changes={"tokens_per_day": 1000})
    other, _ = inference_key_issue(
        actor=actor(alex), department=legal, name="other", expires_in_days=3
    )
    now = datetime.now(UTC)
    metered(deployment, key, 600, at=now)
    assert door_access(deployment).limited == {}
    metered(deployment, other, 400, at=now)  # the department's keys together

    limited = door_access(deployment).limited["dept:legal"]

    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    assert limited == Limited(int(midnight.timestamp()), "tokens_per_day", 1000)


# -- API ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_reads_and_sets_a_department_s_limits(as_root, as_lena, legal, root, tmp_path):
    url = "/api/v1/departments/legal/limits/"
    changed = as_root.patch(url, {"tokens_per_day": 1000, "tokens_per_month": 20000}, format="json")
    assert changed.status_code == 200, changed.content
    body = as_lena.get(url).json()
    assert body["tokens_per_day"] == 1000 and body["requests_per_minute"] is None
    assert [b["limit"] for b in body["budgets"]] == ["tokens_per_day", "tokens_per_month"]
    # No deployment sends spans yet: what was used is unknown, not 0 (issue 43).
    assert (body["budgets"][0]["used"], body["budgets"][0]["left"]) == (None, None)
    mark_metered(make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "v"))
    body = as_lena.get(url).json()
    assert (body["budgets"][0]["used"], body["budgets"][0]["left"]) == (0, 1000)
    assert as_lena.patch(url, {"tokens_per_day": 5}, format="json").status_code == 403
    refused = as_root.patch(url, {"tokens_per_day": 0}, format="json")
    assert refused.status_code == 400 and "tokens_per_day" in refused.content.decode()


@pytest.mark.django_db
def test_an_outsider_learns_nothing_of_a_department_s_limits(as_fred, legal):
    assert as_fred.get("/api/v1/departments/legal/limits/").status_code == 404


@pytest.mark.django_db
def test_the_api_sets_a_key_s_limits_and_shows_them(as_alex, key, root, legal):
    department_limits_set(actor=actor(root), department=legal, changes={"requests_per_minute": 100})
    url = f"/api/v1/inference-keys/{key.pk}/limits/"
    answer = as_alex.patch(url, {"requests_per_minute": 50}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["requests_per_minute"] == 50
    above = as_alex.patch(url, {"requests_per_minute": 500}, format="json")
    assert above.status_code == 400
    assert "above the department's own (100)" in above.content.decode()


@pytest.mark.django_db
def test_the_department_keys_page_shows_the_limits_and_what_is_left(
    client, alex, root, legal, key, tmp_path
):
    changes = {"requests_per_minute": 120, "tokens_per_day": 5000}
    department_limits_set(actor=actor(root), department=legal, changes=changes)
    deployment = make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "v")
    metered(deployment, key, 1200, at=datetime.now(UTC))
    client.force_login(alex)
    page = client.get("/departments/legal/keys/").content.decode()
    assert "120 requests a minute" in page
    assert "5,000 tokens a day" in page
    budget = page[page.index('data-testid="budget-tokens_per_day"') :]
    budget = budget[: budget.index("</tr>")]
    assert "<td>1,200</td>" in budget and "<td>3,800</td>" in budget


@pytest.mark.django_db
def test_the_admin_sets_a_department_s_limits_through_the_service(client, root, legal):
    client.force_login(root)
    url = "/admin/serving/departmentlimits/add/"
    form = {"department": legal.pk, "requests_per_minute": "60", "tokens_per_day": ""}
    form |= {"tokens_per_minute": "", "tokens_per_month": ""}
    assert client.post(url, form).status_code == 302
    assert DepartmentLimits.objects.get(department=legal).requests_per_minute == 60
    assert AuditEvent.objects.filter(action="department_limits.changed").count() == 1

    limits = DepartmentLimits.objects.get(department=legal)
    change = f"/admin/serving/departmentlimits/{limits.pk}/change/"
    bad = client.post(change, {**form, "tokens_per_day": "500", "tokens_per_month": "100"})
    assert bad.status_code == 200  # the form again, with the error
    assert "tokens_per_day" in bad.content.decode() or "could never" in bad.content.decode()
    assert DepartmentLimits.objects.get(department=legal).tokens_per_day is None


@pytest.mark.django_db
def test_a_department_approver_may_not_open_the_limits_admin(client, alex):
    client.force_login(alex)
    assert client.get("/admin/serving/departmentlimits/").status_code in (302, 403)


@pytest.mark.django_db
def test_an_approver_sets_a_key_s_limits_on_the_department_s_page(client, alex, root, legal, key):
    department_limits_set(actor=actor(root), department=legal, changes={"requests_per_minute": 100})
    client.force_login(alex)
    url = f"/keys/{key.pk}/limits/"
    page = client.get("/departments/legal/keys/").content.decode()
    assert f'action="{url}"' in page

    client.post(url, {"requests_per_minute": "40", "tokens_per_minute": ""})
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute) == (40, None)

    refused = client.post(url, {"requests_per_minute": "400"}, follow=True).content.decode()
    assert "above the department&#x27;s own (100)" in refused
    assert client.post(url, {"requests_per_minute": "lots"}, follow=True).status_code == 200
    key.refresh_from_db()
    assert key.requests_per_minute == 40


@pytest.mark.django_db
def test_a_member_gets_no_limits_form_and_cannot_post_one(client, lena, legal, key):
    client.force_login(lena)
    page = client.get("/departments/legal/keys/").content.decode()
    assert f"/keys/{key.pk}/limits/" not in page
    assert client.post(f"/keys/{key.pk}/limits/", {"requests_per_minute": "1"}).status_code == 404
    key.refresh_from_db()
    assert key.requests_per_minute is None
