"""The deployment page says where each adapter lives and why (serving.rules.placement_plan),
naming replicas by label for members, and shows a replica placement leaves out
as "not placed" rather than as drift."""

from __future__ import annotations

import pytest
from django.utils import timezone

from serving.models import Replica, ServedAdapter
from tests.serving.web import test_pages

# The page tests' fixtures, shared.
approved, fakes, staging = test_pages.approved, test_pages.fakes, test_pages.staging
served = test_pages.served

pytestmark = pytest.mark.django_db


def test_the_page_shows_where_a_bounded_adapter_lives_and_why(web_lena, staging, approved, fakes):
    path = "/volume/legal/contracts/v1"
    row = served(staging, approved, path=path)
    now = timezone.now()
    first, second = (
        Replica.objects.create(
            deployment=staging,
            base_url=f.base_url,
            health="up",
            last_checked_at=now,
            loaded_adapters=[{"id": approved.adapter.served_name, "root": path}] if i == 0 else [],
        )
        for i, f in enumerate(sorted(fakes, key=lambda f: f.base_url))
    )
    ServedAdapter.objects.filter(pk=row.pk).update(
        max_replicas=1,
        placement={"replicas": [first.pk], "reason": "min", "wanted": 1, "demand": 0.0},
    )

    page = web_lena.get(f"/deployments/{staging.name}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "on 1 of 2 replicas (replica-1): held at min_replicas" in html
    assert "not placed" in html  # the second replica, which placement leaves out
    assert 'pill-ok" data-testid="drift-count">no drift' in html
    assert second.base_url not in html and first.base_url not in html
