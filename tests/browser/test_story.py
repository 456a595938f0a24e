"""The story from issue 5, in a real browser: a Legal member uploads and
submits a version, cannot approve it; a Legal approver approves it from the
queue; a Finance member cannot see the Legal adapter. Steps 4 and 5 (promote
through the gate, watch the rollout succeed live) are in test_serving_story.py."""

from __future__ import annotations

import re

import pytest

from registry.models import AdapterVersion
from tests.browser.conftest import LAPTOP, TABLET
from tests.conftest import PASSWORD
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import AdapterSpec, adapter_tar_gz, tar_gz_bytes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def sign_in(page, username: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))


def no_horizontal_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


RECORD_PROGRESS = """
document.addEventListener("htmx:xhr:progress", () => {
  const bar = document.querySelector("form[data-upload] progress");
  const seen = JSON.parse(sessionStorage.getItem("progress") || "[]");
  seen.push(bar ? bar.value : -1);
  sessionStorage.setItem("progress", JSON.stringify(seen));
});
"""


def test_member_uploads_and_submits_approver_approves_outsider_sees_nothing(
    new_page, screenshot, tmp_path, lena, alex, paula, fred, legal
):
    contracts = make_adapter(lena, legal, description="Flags risky clauses in contracts.")
    make_approved_version(lena, paula, contracts, AdapterSpec(seed=1))

    # 1. A Legal member signs in, uploads a new version through the page, and submits it.
    member = new_page()
    member.goto("/login/")
    member.keyboard.press("Tab")
    outline = member.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "keyboard focus must be visible"
    screenshot(member, "login")
    sign_in(member, "lena")
    screenshot(member, "dashboard")

    member.get_by_role("link", name="contracts").first.click()
    member.wait_for_url(f"**/adapters/{contracts.pk}/")

    bad = tmp_path / "pickled.tar.gz"
    files = AdapterSpec(seed=2).files()
    files["adapter_model.bin"] = files.pop("adapter_model.safetensors")
    bad.write_bytes(tar_gz_bytes(files))
    member.get_by_label("Adapter archive or files").set_input_files(str(bad))
    member.get_by_role("button", name="Upload and validate").click()
    error = member.locator("#upload-error")
    error.wait_for()
    assert "convert" in error.inner_text().lower()
    assert AdapterVersion.objects.filter(adapter=contracts).count() == 1
    screenshot(member, "adapter-upload-refused")

    good = tmp_path / "contracts-v2.tar.gz"
    spec = AdapterSpec(seed=3, r=16, target_modules=["q_proj", "k_proj", "v_proj"])
    good.write_bytes(adapter_tar_gz(spec))
    member.add_init_script(RECORD_PROGRESS)
    member.evaluate(RECORD_PROGRESS)
    member.get_by_label("Adapter archive or files").set_input_files(str(good))
    member.get_by_role("button", name="Upload and validate").click()
    member.wait_for_url(re.compile(r"/versions/\d+/$"))
    version = AdapterVersion.objects.get(adapter=contracts, number=2)
    assert member.url.endswith(f"/versions/{version.pk}/")
    assert "Registered version 2." in member.content()
    progress = member.evaluate("JSON.parse(sessionStorage.getItem('progress') || '[]')")
    assert progress and progress[-1] == 100, progress

    member.get_by_role("button", name="Submit for review").click()
    member.locator(".alert-success", has_text="submitted for review").wait_for()
    assert member.locator("h1 .badge").inner_text() == "Pending review"

    # 2. The member cannot approve it: no button, and no review queue in the nav.
    assert member.get_by_role("button", name="Approve").count() == 0
    assert member.get_by_role("link", name=re.compile("Review queue")).count() == 0
    screenshot(member, "version-pending")

    # 3. A Legal approver sees it in the queue, with the diff, and approves it.
    approver = new_page()
    sign_in(approver, "alex")
    assert approver.get_by_test_id("pending-count").inner_text() == "1"
    approver.get_by_role("link", name=re.compile("Review queue")).click()
    review = approver.get_by_test_id(f"review-{version.pk}")
    review.wait_for()
    assert review.locator("td.changed", has_text="16").count() == 1
    assert review.locator(".chip.added", has_text="k_proj").count() == 1
    screenshot(approver, "review-queue")
    review.get_by_label("Comment (optional)").fill("Rank 16 is within budget.")
    review.get_by_role("button", name="Approve v2").click()
    approver.locator(".alert-success", has_text="contracts v2 approved.").wait_for()
    version.refresh_from_db()
    assert (version.status, version.reviewed_by) == ("approved", alex)

    approver.goto(f"/versions/{version.pk}/")
    assert approver.locator("h1 .badge").inner_text() == "Approved"
    screenshot(approver, "version-approved")
    approver.goto(f"/adapters/{contracts.pk}/")
    screenshot(approver, "adapter")

    approver.goto("/tokens/")
    approver.get_by_label("Name").fill("nightly-training")
    approver.get_by_label("Register versions").check()
    approver.get_by_role("button", name="Create token").click()
    assert approver.get_by_test_id("token-secret").inner_text().startswith("lrt_")
    screenshot(approver, "tokens")

    # 6. A Finance member cannot see the Legal adapter.
    outsider = new_page()
    sign_in(outsider, "fred")
    assert outsider.get_by_role("link", name="contracts").count() == 0
    response = outsider.goto(f"/adapters/{contracts.pk}/")
    assert response.status == 404
    assert "Not found" in outsider.content()
    screenshot(outsider, "outsider-404")


def test_pages_fit_a_tablet_and_a_laptop(new_page, screenshot, lena, alex, paula, legal):
    contracts = make_adapter(lena, legal, description="Flags risky clauses in contracts.")
    version = make_approved_version(lena, paula, contracts, AdapterSpec(seed=4))
    for viewport, suffix in ((TABLET, "tablet"), (LAPTOP, "laptop")):
        page = new_page(viewport)
        sign_in(page, "alex")
        for path, name in (
            ("/", "dashboard"),
            (f"/adapters/{contracts.pk}/", "adapter"),
            (f"/versions/{version.pk}/", "version"),
        ):
            page.goto(path)
            assert no_horizontal_scroll(page), f"{path} scrolls sideways at {suffix} width"
            if suffix == "tablet":
                screenshot(page, f"{name}-tablet")
