"""Issue 47, item 7: the notification preferences and the mail outbox in real
Chromium, at a laptop's 1280 px and a phone's 390 px.

A Legal approver (alex, who also co-owns the adapter) chooses email for
"a version waits for review" (he had chosen the app only) and off for "a
version was approved", saves, and finds both after a reload and in the
database. A Legal member submits a version through its page; the worker's
steps (the fan-out, then each email) run in the test's process
(tests/notifications/conftest.py's fan_out_all) and the local outbox backend
keeps the emails. The approver sees the unread badge, opens "Your mail",
finds the email naming the adapter and version, follows its link to the
version page and approves it there: the approval concerns him as an owner,
but he turned that kind off, so he gets neither a notification nor an email
of it (the member does). A Finance member's outbox shows none of Legal's mail.

Every page is checked by test_journeys' Walk (no debug page, no raw exception,
no sideways scroll) and screenshotted under notifications-<width>/.
"""

from __future__ import annotations

import re

import pytest

from config.celery import app as celery_app
from notifications.events import KINDS
from notifications.models import (
    Channel,
    EmailStatus,
    Notification,
    OutboxMail,
    Preference,
)
from notifications.services.email import notification_email_send
from notifications.services.outbox import recipients
from registry.models import VersionStatus
from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_journeys import LAPTOP, PHONE, Walk
from tests.browser.test_story import sign_in
from tests.factories import make_adapter, make_version
from tests.notifications.conftest import fan_out_all
from tests.support.adapters import AdapterSpec
from tests.support.workers import purge_queues

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SUBMITTED, APPROVED = "version.submitted", "version.approved"

# True when the element is laid out and its whole width is inside the window and
# inside every ancestor that clips it (a .table-wrap scrolls sideways: a radio
# past its edge would need a sideways swipe to be seen).
NOT_CLIPPED = """el => {
  const box = el.getBoundingClientRect();
  let left = 0, right = window.innerWidth;
  for (let p = el.parentElement; p; p = p.parentElement) {
    if (getComputedStyle(p).overflowX !== "visible") {
      const clip = p.getBoundingClientRect();
      left = Math.max(left, clip.left);
      right = Math.min(right, clip.right);
    }
  }
  return box.width > 0 && box.height > 0 && box.left >= left - 0.5 && box.right <= right + 0.5;
}"""


def not_clipped(locator) -> bool:
    return locator.is_visible() and locator.evaluate(NOT_CLIPPED)


def send_due_emails() -> dict[str, str]:
    """What the email worker does for each notification that wants an email."""
    due = Notification.objects.filter(email_status=EmailStatus.PENDING).select_related("user")
    return {n.user.username: notification_email_send(n.pk, "browser-test") for n in due}


def radio(page, kind: str, label: str):
    return page.get_by_label(f"{KINDS[kind].summary}: {label}", exact=True)


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1280px", "390px"])
def test_an_approver_chooses_how_he_is_told_and_follows_his_email(
    new_page, live_server, settings, viewport, lena, alex, paula, fred, legal
):
    settings.EMAIL_BACKEND = "notifications.mail_outbox.OutboxBackend"
    settings.NOTIFICATIONS_SITE_URL = live_server.url
    purge_queues(celery_app)  # the live server enqueues the fan-out; this test runs it
    try:
        _story(new_page, live_server, viewport, lena, alex, legal)
    finally:
        purge_queues(celery_app)


def _story(new_page, live_server, viewport, lena, alex, legal):
    folder = SCREENSHOTS / f"notifications-{viewport['width']}"
    contracts = make_adapter(lena, legal, served_name="legal-contracts", owners=["lena", "alex"])
    version = make_version(lena, contracts, AdapterSpec(seed=71))
    # An earlier choice, which the page must change: without the save, no email.
    Preference.objects.create(user=alex, kind=SUBMITTED, channel="in_app")
    # A Finance member's own mail, which only he may see.
    OutboxMail.objects.create(to="fred@example.com", subject="[LoRA Registry] ledger v3", body=".")

    # 1. The approver finds his choices from the inbox, changes two and saves.
    approver = Walk(new_page(viewport), "approver", viewport, [], folder)
    page = approver.page
    sign_in(page, "alex")
    assert page.get_by_test_id("unread-badge").count() == 0
    page.get_by_role("link", name=re.compile(r"^Notifications")).click()
    page.wait_for_url("**/notifications/")
    page.get_by_role("link", name="Choose how each kind reaches you").click()
    page.wait_for_url("**/notifications/preferences/")
    approver.check("preferences-before")
    assert radio(page, SUBMITTED, "In the app only").is_checked()
    assert radio(page, APPROVED, "Email and in the app").is_checked()  # the kind's default
    save = page.get_by_role("button", name="Save")
    choices = [radio(page, k, label) for k in (SUBMITTED, APPROVED) for _, label in Channel.choices]
    for control in [*choices, save]:
        assert not_clipped(control), f"clipped at {viewport['width']} px: {control}"
    radio(page, SUBMITTED, "Email and in the app").check()
    radio(page, APPROVED, "Off").check()
    save.click()
    page.locator(".alert-success", has_text="Saved how you are told.").wait_for()

    page.reload()
    assert radio(page, SUBMITTED, "Email and in the app").is_checked()
    assert radio(page, APPROVED, "Off").is_checked()
    assert not radio(page, APPROVED, "Email and in the app").is_checked()
    approver.check("preferences-saved")
    chosen = dict(Preference.objects.filter(user=alex).values_list("kind", "channel"))
    assert chosen[SUBMITTED] == "email" and chosen[APPROVED] == "off", chosen
    untouched = {k: c for k, c in chosen.items() if k not in (SUBMITTED, APPROVED)}
    assert untouched == {k: KINDS[k].default for k in untouched}, "a kind left alone changed"

    # 2. A Legal member submits the version from its page.
    member = Walk(new_page(viewport), "member", viewport, [], folder)
    sign_in(member.page, "lena")
    member.visit(f"/versions/{version.pk}/", "version-draft")
    member.page.get_by_role("button", name="Submit for review").click()
    member.page.locator(".alert-success", has_text="submitted for review").wait_for()

    # 3. The worker's steps: the event fanned out, then each email sent.
    assert [e.kind for e in fan_out_all()] == [SUBMITTED]
    assert send_due_emails() == {"alex": "sent", "paula": "sent"}
    subject = "[LoRA Registry] legal/contracts version 1 waits for your review"
    assert OutboxMail.objects.filter(to="alex@example.com").get().subject == subject

    # 4. The approver sees the badge, the notification, and his mail.
    page.goto("/")
    badge = page.get_by_test_id("unread-badge")
    assert badge.inner_text() == "1"
    assert badge.get_attribute("aria-label") == "1 unread"
    assert not_clipped(badge)
    page.get_by_role("link", name=re.compile(r"^Notifications")).click()
    page.wait_for_url("**/notifications/")
    rows = page.get_by_test_id("notification")
    assert rows.count() == 1
    assert "legal/contracts version 1 waits for your review" in rows.inner_text()
    assert rows.get_by_label("unread").is_visible()
    approver.check("inbox")
    page.get_by_role("link", name="Your mail").click()
    page.wait_for_url("**/notifications/outbox/")
    approver.check("outbox")
    mails = page.get_by_test_id("mail")
    assert mails.count() == 1
    assert mails.get_by_role("heading").inner_text() == subject
    target = f"{live_server.url}/versions/{version.pk}/"
    link = mails.get_by_role("link", name=target, exact=True)
    assert link.get_attribute("href") == target
    assert not_clipped(link), f"the email's link is clipped at {viewport['width']} px"

    # 5. Its link leads to the version, which he approves there.
    link.click()
    page.wait_for_url(f"**/versions/{version.pk}/")
    assert page.locator("h1 .badge").inner_text() == "Pending review"
    approver.check("version-from-email")
    page.get_by_role("button", name="Approve", exact=True).click()
    page.locator(".alert-success", has_text="contracts v1 approved.").wait_for()
    version.refresh_from_db()
    assert version.status == VersionStatus.APPROVED

    # 6. The approval concerns him (an owner), but he turned that kind off:
    # no notification and no email for him; the member is told by email.
    approved = fan_out_all()
    assert [e.kind for e in approved] == [APPROVED]
    assert alex.pk in recipients(approved[0])
    assert not Notification.objects.filter(user=alex, event=approved[0]).exists()
    assert send_due_emails() == {"lena": "sent"}
    assert OutboxMail.objects.filter(to="lena@example.com", subject__contains="approved").exists()
    page.goto("/notifications/outbox/")
    assert page.get_by_test_id("unread-badge").inner_text() == "1"
    assert page.get_by_test_id("mail").count() == 1
    assert "approved" not in page.get_by_test_id("mail").inner_text()
    approver.check("outbox-after-approval")

    # 7. A Finance member's outbox: his own mail, none of Legal's.
    outsider = Walk(new_page(viewport), "outsider", viewport, [], folder)
    sign_in(outsider.page, "fred")
    outsider.visit("/notifications/outbox/", "outbox")
    theirs = outsider.page.get_by_test_id("mail")
    assert theirs.count() == 1
    assert theirs.get_by_role("heading").inner_text() == "[LoRA Registry] ledger v3"
    assert "contracts" not in outsider.page.locator("main").inner_text()
