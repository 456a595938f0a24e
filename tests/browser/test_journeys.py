"""Issue 33's done-when: the member, approver and admin journeys in real
Chromium, at a laptop's 1280 px and a phone's 390 px. A Legal member uploads a
version and submits it; a Legal approver approves it; the member promotes it
and watches the rollout (a real Celery worker) succeed; each sees it live
beside what is approved, and the usage and cost page; a platform admin looks
over the deployment, the Adapters page and usage.

Every page visited must be the product's own: no Django debug page, no raw
exception, no server path or storage URI shown to a member, no sideways scroll.
The screenshots land in test-artifacts/screenshots/journeys-<width>/ (the
README's three come from the 1280 px run).
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from config.celery import app as celery_app
from observability.models import DailyUsage
from registry.models import AdapterVersion
from serving.models import Rollout, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_serving_story import celery_worker
from tests.browser.test_story import sign_in
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec, adapter_tar_gz
from tests.support.vllm_standin import serve_standin
from tests.support.workers import purge_queues

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}

DEBUG_PAGE = ("Using the URLconf", "Traceback (most recent call last)", "technical_500",
              "Exception Value:", "Request Method:", "DisallowedHost")  # fmt: skip
# A Python exception's name and message as it would leak into a page ("KeyError: 'x'").
RAW_EXCEPTION = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception): ")


class Walk:
    """One person's browser page: every visit is checked and screenshotted."""

    def __init__(self, page, who: str, viewport: dict, forbidden: list[str], folder: Path):
        self.page, self.who, self.viewport = page, who, viewport
        self.forbidden, self.folder = forbidden, folder
        self.count = 0

    def check(self, name: str) -> None:
        page = self.page
        html = page.content()
        text = page.locator("body").inner_text()
        where = f"{self.who} at {self.viewport['width']} px on {page.url} ({name})"
        for mark in DEBUG_PAGE:
            assert mark not in html, f"debug page: {mark!r}: {where}"
        raw = RAW_EXCEPTION.search(text)
        assert raw is None, f"raw exception {text[raw.start() : raw.start() + 120]!r}: {where}"
        for needle in self.forbidden:
            # Not inside a random token: a CSRF token once held "...ZcPVC7I...".
            shown = re.search(rf"(?<![A-Za-z0-9]){re.escape(needle)}(?![A-Za-z0-9])", html)
            assert shown is None, f"{needle!r} shown to {where}"
        overflow = page.evaluate(
            "[document.documentElement.scrollWidth, window.innerWidth]"
        )  # fmt: skip
        assert overflow[0] <= overflow[1], f"scrolls sideways ({overflow}): {where}"
        self.count += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.who}-{self.count:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)

    def visit(self, path: str, name: str) -> None:
        response = self.page.goto(path)
        assert response is not None and response.status < 400, (path, response and response.status)
        self.check(name)


def _internals(tmp_path: Path, deployment) -> list[str]:
    return [str(tmp_path), str(settings.BASE_DIR), str(settings.VAR_DIR), "file://", "s3://",
            "PVC", deployment.volume_serve_path]  # fmt: skip


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1280px", "390px"])
def test_member_approver_and_admin_journeys(
    new_page, tmp_path, viewport, lena, alex, paula, legal, root, settings
):
    settings.COST_CURRENCY = "EUR"
    replicas = [serve_standin(), serve_standin()]
    try:
        _journeys(new_page, tmp_path, viewport, lena, alex, paula, legal, root, replicas)
    finally:
        for replica in replicas:
            replica.close()


def _journeys(new_page, tmp_path, viewport, lena, alex, paula, legal, root, replicas):
    contracts = make_adapter(
        lena, legal, served_name="legal-contracts", description="Flags risky clauses."
    )
    make_approved_version(lena, paula, contracts, AdapterSpec(seed=1))
    deployment = make_deployment(
        root,
        [r.base_url for r in replicas],
        tmp_path / "volume",
        description="Legal's staging deployment of",
        gpu_memory_bytes=16 * 1024**3,
        lora_memory_share=0.15,
    )
    purge_queues(celery_app)
    folder = SCREENSHOTS / f"journeys-{viewport['width']}"
    forbidden = _internals(tmp_path, deployment)

    # The member: dashboard, the Adapters page, the adapter; uploads v2 and submits it.
    member = Walk(new_page(viewport), "member", viewport, forbidden, folder)
    sign_in(member.page, "lena")
    member.check("dashboard")
    member.page.get_by_role("link", name="Adapters", exact=True).click()
    member.page.wait_for_url("**/adapters/")
    member.check("adapters")
    member.page.get_by_role("link", name="contracts").first.click()
    member.page.wait_for_url(f"**/adapters/{contracts.pk}/")
    member.check("adapter")
    archive = tmp_path / "contracts-v2.tar.gz"
    archive.write_bytes(adapter_tar_gz(AdapterSpec(seed=2, r=16)))
    member.page.get_by_label("Adapter archive or files").set_input_files(str(archive))
    member.page.get_by_role("button", name="Upload and validate").click()
    member.page.wait_for_url(re.compile(r"/versions/\d+/$"))
    v2 = AdapterVersion.objects.get(adapter=contracts, number=2)
    member.page.get_by_role("button", name="Submit for review").click()
    member.page.locator(".alert-success", has_text="submitted for review").wait_for()
    member.check("version-submitted")

    # The approver approves it from the review queue.
    approver = Walk(new_page(viewport), "approver", viewport, [], folder)
    sign_in(approver.page, "alex")
    approver.page.get_by_role("link", name=re.compile("Review queue")).click()
    review = approver.page.get_by_test_id(f"review-{v2.pk}")
    review.wait_for()
    approver.check("review-queue")
    review.get_by_role("button", name="Approve v2").click()
    approver.page.locator(".alert-success", has_text="contracts v2 approved.").wait_for()
    approver.check("approved")

    # The member sees v2 approved and not yet live, and promotes it through the gate.
    member.visit("/", "dashboard-approved-not-live")
    standing = member.page.get_by_test_id("standing").first.inner_text()
    assert "v2 approved, not promoted" in standing, standing
    member.page.get_by_role("link", name="Promote").first.click()
    member.page.wait_for_url(f"**/versions/{v2.pk}/#serving")
    member.page.get_by_label("Promote to…").select_option("staging-cpu")
    member.page.get_by_test_id("gate").wait_for()
    assert "v2 is compatible with staging-cpu" in member.page.get_by_test_id("gate").inner_text()
    member.check("promote-gate")
    member.page.get_by_role("button", name="Promote to staging-cpu").click()
    member.page.wait_for_url(re.compile(r"/rollouts/\d+/$"))
    started = time.monotonic()
    with celery_worker():
        member.page.locator('#rollout-live[data-status="succeeded"]').wait_for(timeout=60_000)
    print(f"\n[journeys {viewport['width']}] rollout succeeded {time.monotonic() - started:.1f}s")
    member.check("rollout-succeeded")
    reconcile_deployment(deployment.pk, "browser-test")
    assert ServedAdapter.objects.get(adapter=contracts).version_id == v2.pk

    # Live: what the front door's counters would have recorded (usage is counted
    # there at each reconcile; these stand-in replicas have no door), and the
    # door's address, which only the pages read (the rollout ran without one).
    for days_ago, requests in ((1, 120), (0, 80)):
        DailyUsage.objects.create(
            day=timezone.now().date() - timedelta(days=days_ago),
            deployment=deployment,
            department=legal,
            adapter=contracts,
            served_name="legal-contracts",
            version=v2,
            version_number=2,
            requests=requests,
            errors_4xx=1,
        )
    settings.SERVING_DOORS = {"staging-cpu": "127.0.0.1:8200"}

    member.visit("/", "dashboard-live")
    standing = member.page.get_by_test_id("standing").first.inner_text()
    assert "serving v2 on staging-cpu" in standing and "not promoted" not in standing, standing
    member.visit(f"/adapters/{contracts.pk}/", "adapter-live")
    card = member.page.get_by_test_id("client-access-staging-cpu").inner_text()
    assert "Authorization: Bearer <your key>" in card and "legal-contracts" in card
    member.visit("/deployments/staging-cpu/", "deployment")
    member.visit("/usage/", "usage")
    costs = member.page.get_by_test_id("cost-legal").inner_text()
    assert "EUR" in costs, costs
    member.page.get_by_label("Department").select_option("legal")
    member.page.get_by_role("button", name="Show").click()
    member.page.wait_for_url("**/usage/?department=legal**")
    member.check("usage-legal")

    # The approver sees it live too.
    approver.visit("/adapters/?served=staging-cpu", "adapters-served")
    assert "serving v2 on staging-cpu" in approver.page.get_by_test_id("standing").inner_text()
    approver.visit(f"/versions/{v2.pk}/", "version-live")
    assert "Served on staging-cpu" in approver.page.get_by_test_id("served-on").inner_text()

    # The admin: deployments, one deployment with its replicas, the Adapters
    # page, usage across departments, the activity log, and a wrong address.
    admin = Walk(new_page(viewport), "admin", viewport, [], folder)
    sign_in(admin.page, "root")
    admin.check("dashboard")
    admin.visit("/deployments/", "deployments")
    admin.visit("/deployments/staging-cpu/", "deployment")
    rollout = Rollout.objects.filter(target_version=v2).get()
    admin.visit(f"/rollouts/{rollout.pk}/", "rollout")
    admin.visit("/adapters/?department=legal&standing=live", "adapters-filtered")
    admin.visit("/usage/", "usage")
    admin.visit("/activity/", "activity")
    admin.visit("/planner/", "planner")
    missing = admin.page.goto("/no-such-page/")
    assert missing is not None and missing.status == 404
    assert "Not found" in admin.page.content()
    admin.check("not-found")
