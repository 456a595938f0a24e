"""The adapter and deployment pages say how each served adapter is used, from
what vLLM's metrics reported at the reconciles, and suggest retiring idle ones."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import AdapterActivity, ReplicaLoraState
from serving.models import Replica, ServedAdapter

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(deployment, approved_v1):
    return ServedAdapter.objects.create(
        deployment=deployment, adapter=approved_v1.adapter, version=approved_v1, served_path="/v/1"
    )


def seen(deployment, adapter, ago: timedelta, samples: int = 7):
    return AdapterActivity.objects.create(
        deployment=deployment,
        served_name=adapter.served_name,
        adapter=adapter,
        first_active_at=timezone.now() - ago - timedelta(days=1),
        last_active_at=timezone.now() - ago,
        active_samples=samples,
    )


def usage_cell(page: str, testid: str) -> str:
    start = page.index(f'data-testid="{testid}"')
    return page[start : page.index("</tr>", start)]


def test_last_used_hours_ago(web_lena, deployment, contracts, served):
    seen(deployment, contracts, timedelta(hours=3))
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    row = usage_cell(page, f"usage-{deployment.name}")
    assert "last used 3\xa0hours ago" in row and ">7<" in row
    assert "consider retiring" not in row
    page = web_lena.get(f"/deployments/{deployment.name}/").content.decode()
    assert "last used 3\xa0hours ago" in usage_cell(page, "usage-legal-contracts")


def test_idle_for_days_suggests_retiring(web_lena, settings, deployment, contracts, served):
    settings.OBSERVABILITY_IDLE_DAYS = 7
    seen(deployment, contracts, timedelta(days=12))
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    row = usage_cell(page, f"usage-{deployment.name}")
    assert "idle for 1\xa0week, 5\xa0days" in row
    assert "Not used for over 7 days: consider retiring it" in row
    page = web_lena.get(f"/deployments/{deployment.name}/").content.decode()
    assert "consider retiring it" in usage_cell(page, "usage-legal-contracts")


def test_never_seen_and_served_long_ago_is_idle_too(
    web_lena, settings, deployment, contracts, served
):
    ServedAdapter.objects.filter(pk=served.pk).update(
        updated_at=timezone.now() - timedelta(days=30)
    )
    page = web_lena.get(f"/deployments/{deployment.name}/").content.decode()
    row = usage_cell(page, "usage-legal-contracts")
    assert "idle for 1\xa0month" in row and "consider retiring" in row


def test_just_served_and_not_seen_yet(web_lena, deployment, contracts, served):
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    assert "not seen active since served" in usage_cell(page, f"usage-{deployment.name}")


def test_active_now_while_vllm_reports_it_running(web_lena, deployment, contracts, served):
    seen(deployment, contracts, timedelta(seconds=2))
    replica = Replica.objects.create(deployment=deployment, base_url="http://r:8000", health="up")
    ReplicaLoraState.objects.create(
        replica=replica,
        observed_at=timezone.now(),
        ok=True,
        running=["legal-contracts"],
        series_timestamp=time.time() - 2,
    )
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    assert 'data-testid="usage-active"' in usage_cell(page, f"usage-{deployment.name}")
    page = web_lena.get(f"/deployments/{deployment.name}/").content.decode()
    assert "active now" in usage_cell(page, "usage-legal-contracts")


def test_a_stale_running_series_is_not_active_now(web_lena, deployment, contracts, served):
    # An idle vLLM keeps exporting its last label set, stamped when it went idle.
    seen(deployment, contracts, timedelta(hours=1))
    replica = Replica.objects.create(deployment=deployment, base_url="http://r:8000", health="up")
    ReplicaLoraState.objects.create(
        replica=replica,
        observed_at=timezone.now(),
        ok=True,
        running=["legal-contracts"],
        series_timestamp=time.time() - 3600,
    )
    page = web_lena.get(f"/deployments/{deployment.name}/").content.decode()
    row = usage_cell(page, "usage-legal-contracts")
    assert "active now" not in row and "last used an hour ago" in row


def test_outsiders_do_not_see_other_departments_adapters(web_fred, deployment, contracts, served):
    seen(deployment, contracts, timedelta(hours=3))
    page = web_fred.get(f"/deployments/{deployment.name}/").content.decode()
    assert 'data-testid="usage-legal-contracts"' not in page
    assert web_fred.get(f"/adapters/{contracts.pk}/").status_code == 404


def test_the_adapter_page_says_no_request_was_counted_without_a_front_door(
    web_lena, deployment, contracts, served
):
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    start = page.index(f'data-testid="requests-{deployment.name}"')
    assert "Counted at a front door only" in page[start : page.index("</td>", start)]
    assert f"/usage/?department={contracts.department.slug}" in page


def test_the_adapter_page_shows_the_tokens_vllm_counted_for_every_caller(
    web_lena, deployment, contracts, served, finance
):
    from observability.models import DailyTokens

    for department, key_ref, prompt, completion in (
        (contracts.department, 1, 40, 2),
        (finance, 2, 60, 8),
    ):
        DailyTokens.objects.create(
            day=timezone.now().date(),
            deployment=deployment,
            key_ref=key_ref,
            version_ref=served.version_id,
            department=department,
            owner=contracts.department,
            adapter=contracts,
            version=served.version,
            served_name=contracts.served_name,
            version_number=served.version.number,
            requests=1,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
    page = web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
    start = page.index(f'data-testid="tokens-{deployment.name}"')
    assert ">110<" in page[start : page.index("</td>", start) + 5]
