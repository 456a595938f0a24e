"""Steps 4 and 5 of the issue 5 story, in a real browser (steps 1-3 and 6 are
in test_story.py): a Legal approver promotes the approved version to a
deployment, seeing the compatibility gate first, and the rollout page reaches
"succeeded" live, without a reload.

The rollout is a Celery task run by a real worker (threads, in this process)
on the configured broker. It is started only once the rollout page shows the
rollout pending, so what the page shows next can only have come from its own
polling. The replicas are the fake vLLM by default and a real vLLM server
where one can run (the `vllm` tier).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connections

from config.celery import app as celery_app
from serving.models import Rollout
from serving.reconcile.tick import reconcile_deployment
from tests.browser.conftest import TABLET
from tests.browser.test_story import no_horizontal_scroll, sign_in
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec
from tests.support.vllm_servers import vllm_available
from tests.support.vllm_standin import serve_standin
from tests.support.workers import purge_queues

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Records, in the page, every status the polled partial brings in.
RECORD_STATUSES = """
window.sameDocument = true;
window.seenStatuses = [document.querySelector("#rollout-live").dataset.status];
document.body.addEventListener("htmx:afterSettle", () => {
  const live = document.querySelector("#rollout-live");
  if (live) window.seenStatuses.push(live.dataset.status);
});
"""


@contextlib.contextmanager
def celery_worker() -> Iterator[None]:
    """A real worker (thread pool) consuming every queue of the configured broker."""
    app = celery_app
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        shutdown_timeout=60,
        loglevel="WARNING",
    ):
        yield
    purge_queues(app)
    connections.close_all()


@pytest.fixture
def fake_replicas() -> Iterator[list[str]]:
    fakes = [serve_standin(), serve_standin()]
    yield [fake.base_url for fake in fakes]
    for fake in fakes:
        fake.close()


@pytest.fixture
def real_replica(request) -> list[str]:
    """The session's first shared vLLM server (tests/support/vllm_pool.py), up
    and without runtime adapters."""
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/vllm/install.sh)")
    return [request.getfixturevalue("vllm_pool").servers(1)[0].base_url]


def promote_and_watch(
    new_page, screenshot, *, replica_urls, volume, people, suffix: str, timeout_ms: int
):
    lena, alex, paula, legal, root = people
    contracts = make_adapter(
        lena,
        legal,
        served_name="legal-contracts",
        description="Flags risky clauses in contracts.",
    )
    version = make_approved_version(lena, paula, contracts, AdapterSpec(seed=1))
    deployment = make_deployment(
        root,
        replica_urls,
        volume,
        description="Legal's staging deployment of",
        gpu_memory_bytes=16 * 1024**3,
        lora_memory_share=0.15,
    )
    purge_queues(celery_app)

    # 4. The approver opens the approved version and picks a deployment: the
    # compatibility gate's checks appear in place, each with its reason.
    approver = new_page()
    sign_in(approver, "alex")
    approver.goto(f"/versions/{version.pk}/")
    approver.get_by_label("Promote to…").select_option("staging-cpu")
    gate = approver.get_by_test_id("gate")
    gate.wait_for()
    assert "v1 is compatible with staging-cpu" in gate.inner_text()
    assert gate.locator("li.ok").count() == 7  # the host cache too: 1 of 4, none cold
    assert gate.locator("li.fail").count() == 0
    assert "fits max_lora_rank 16" in gate.inner_text()
    approver.locator("#serving").scroll_into_view_if_needed()
    screenshot(approver, f"promote-with-gate{suffix}")
    approver.get_by_role("button", name="Promote to staging-cpu").click()

    # 5. The rollout page: pending until a worker takes it, then live to the end.
    approver.wait_for_url(re.compile(r"/rollouts/\d+/$"))
    rollout = Rollout.objects.get()
    assert approver.url.endswith(f"/rollouts/{rollout.pk}/")
    status = approver.get_by_test_id("rollout-status")
    assert status.inner_text() == "Pending"
    assert "Waiting for a worker" in approver.content()
    approver.evaluate(RECORD_STATUSES)

    started = time.monotonic()
    with celery_worker():
        approver.locator('#rollout-live[data-status="succeeded"]').wait_for(timeout=timeout_ms)
    took = time.monotonic() - started

    assert approver.evaluate("window.sameDocument") is True, "the page was reloaded"
    seen = approver.evaluate("window.seenStatuses")
    assert seen[0] == "pending" and seen[-1] == "succeeded", seen
    assert status.inner_text() == "Succeeded"
    steps = approver.get_by_test_id("replica-step")
    assert steps.count() == len(replica_urls)
    for i in range(steps.count()):
        assert steps.nth(i).get_attribute("data-status") == "succeeded"
        assert steps.nth(i).locator(".step-done").count() == 3  # stage, load, verify
    # Polling has stopped: the final partial carries no trigger.
    assert approver.locator("#rollout-live").get_attribute("hx-trigger") is None
    # The HTTP attempts are there, collapsed.
    first_attempts = approver.locator("details.attempts").first
    assert first_attempts.get_attribute("open") is None
    first_attempts.locator("summary").click()
    assert "load_lora_adapter" in first_attempts.inner_text()
    screenshot(approver, f"rollout-succeeded{suffix}")
    print(f"\n[browser{suffix}] rollout succeeded {took:.1f}s after the worker started")

    # What the replicas say now, as the next reconcile records it.
    reconcile_deployment(deployment.pk, "browser-test")
    approver.goto("/deployments/")
    card = approver.get_by_test_id("deployment-staging-cpu")
    assert f"{len(replica_urls)}/{len(replica_urls)} up" in card.inner_text()
    screenshot(approver, f"deployments{suffix}")
    approver.get_by_role("link", name="staging-cpu").first.click()
    approver.wait_for_url("**/deployments/staging-cpu/")
    row = approver.get_by_test_id("adapter-legal-contracts")
    assert row.locator(".cell-in_sync").count() == len(replica_urls)
    assert approver.get_by_test_id("drift-count").inner_text() == "no drift"
    screenshot(approver, f"deployment-detail{suffix}")

    approver.goto(f"/versions/{version.pk}/")
    assert "Served on staging-cpu" in approver.get_by_test_id("served-on").inner_text()

    tablet = new_page(TABLET)
    sign_in(tablet, "alex")
    for path, name in (
        ("/deployments/", "deployments"),
        ("/deployments/staging-cpu/", "deployment-detail"),
        (f"/rollouts/{rollout.pk}/", "rollout"),
    ):
        tablet.goto(path)
        assert no_horizontal_scroll(tablet), f"{path} scrolls sideways at tablet width"
        screenshot(tablet, f"{name}-tablet{suffix}")


def test_approver_promotes_and_watches_the_rollout_succeed_live(
    new_page, screenshot, fake_replicas, tmp_path, lena, alex, paula, legal, root
):
    promote_and_watch(
        new_page,
        screenshot,
        replica_urls=fake_replicas,
        volume=tmp_path / "volume",
        people=(lena, alex, paula, legal, root),
        suffix="",
        timeout_ms=30_000,
    )


@pytest.mark.vllm
def test_the_same_story_against_a_real_vllm_server(
    new_page, screenshot, real_replica, tmp_path, lena, alex, paula, legal, root, settings
):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 30.0
    settings.SERVING_HTTP_TIMEOUT_SECONDS = 60.0
    promote_and_watch(
        new_page,
        screenshot,
        replica_urls=real_replica,
        volume=tmp_path / "volume",
        people=(lena, alex, paula, legal, root),
        suffix="-vllm",
        timeout_ms=180_000,
    )


def test_refusals_and_failures_read_clearly(
    new_page, screenshot, fake_replicas, tmp_path, lena, alex, paula, legal, root, settings
):
    """The gate's refusal, and a rollout vLLM refused, as an approver sees them."""
    from serving.rollouts.engine import rollout_execute
    from serving.services.promotions import promotion_create
    from tests.conftest import actor

    settings.SERVING_RETRY_DEADLINE_SECONDS = 1.0
    contracts = make_adapter(lena, legal, served_name="legal-contracts")
    version = make_approved_version(lena, paula, contracts, AdapterSpec(seed=1, r=16))
    make_deployment(root, fake_replicas, tmp_path / "v1", name="edge-small", max_lora_rank=8)
    broken = serve_standin()
    try:
        broken.fail_load = (400, "Loading lora legal-contracts failed: size mismatch for q_proj")
        staging = make_deployment(root, [fake_replicas[0], broken.base_url], tmp_path / "v2")
        promotion = promotion_create(actor=actor(alex), deployment=staging, version=version)
        rollout = promotion.rollouts.get()
        assert rollout_execute(rollout.pk, "browser-test") in {"failed", "rolled_back"}
    finally:
        broken.close()

    page = new_page()
    sign_in(page, "alex")
    page.goto(f"/versions/{version.pk}/")
    page.get_by_label("Promote to…").select_option("edge-small")
    gate = page.get_by_test_id("gate")
    gate.wait_for()
    assert "refuses v1 on edge-small" in gate.inner_text()
    assert "Rank 16 exceeds the deployment's max_lora_rank 8." in gate.inner_text()
    assert gate.get_by_role("button").count() == 0
    page.locator("#serving").scroll_into_view_if_needed()
    screenshot(page, "promote-gate-refused")

    page.goto(f"/rollouts/{rollout.pk}/")
    assert "size mismatch for q_proj" in page.get_by_test_id("replica-error").inner_text()
    assert page.locator(".step-failed").count() >= 1
    screenshot(page, "rollout-failed")
