"""A deployment counts as metered only once its replicas' spans arrive, and no
longer when they stop while vLLM still counts tokens (issue 43: the usage page
said nothing was counted while metering_available() said limits were on).
Said by metering_available(), the deployment page and /readyz."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from observability.models import MeteringState
from observability.selectors import SPANS_STALE_SECONDS
from serving.token_usage import metering_available, metering_status
from tests.observability.test_metering import post
from tests.support.otlp import llm_span, otlp_body

pytestmark = pytest.mark.django_db


def test_a_deployment_without_spans_is_not_metered_anywhere_it_is_asked(
    deployment, anonymous, as_root
):
    assert metering_available(deployment.pk) is False
    assert metering_available() is False  # no deployment is metered: limits know nothing
    status = metering_status([deployment.pk])[deployment.pk]
    assert status.detail == "not metered: no spans received from its replicas"
    check = anonymous.get("/readyz").json()["checks"]["metering"]
    assert check == {
        "ok": False,
        "optional": True,
        "notice": f"tokens not metered (no spans from their replicas): {deployment.name}",
    }
    page = as_root.get(f"/deployments/{deployment.name}/").content.decode()
    assert "not metered: no spans received from its replicas" in page
    assert "token limits and budgets do not act on its calls" in page


def test_its_first_span_makes_it_metered(deployment, anonymous, as_root):
    assert post(deployment.name, otlp_body(llm_span("x", 1, 1))).status_code == 200
    assert metering_available(deployment.pk) is True
    assert metering_available() is True
    assert anonymous.get("/readyz").json()["checks"]["metering"] == {"ok": True, "optional": True}
    page = as_root.get(f"/deployments/{deployment.name}/").content.decode()
    assert "metered: vLLM's own counts, per caller" in page


def test_spans_that_stop_while_vllm_counts_tokens_end_it(deployment):
    now = timezone.now()
    stale = timedelta(seconds=SPANS_STALE_SECONDS + 60)
    MeteringState.objects.create(
        deployment=deployment, last_span_at=now - 2 * stale, counted_at=now - timedelta(seconds=5)
    )
    status = metering_status([deployment.pk])[deployment.pk]
    assert not status.metered
    assert "no spans received in the last 15 minutes while its replicas counted" in status.detail
    # Idle since its last span (nothing counted after it): still metered.
    MeteringState.objects.filter(deployment=deployment).update(counted_at=now - 2 * stale)
    assert metering_available(deployment.pk) is True
