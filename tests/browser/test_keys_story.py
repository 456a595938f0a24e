"""Inference keys and grants in a real browser (issue 29): a Legal member issues
a key of their own and sees it once; a Finance member asks to call Legal's
adapter from Finance's Keys page; a Legal approver approves it on the adapter's
page, which then says who may call it and why. Screenshots:
test-artifacts/screenshots/keys-*.png."""

from __future__ import annotations

import pytest

from serving.models import AdapterGrant, GrantStatus, InferenceKey
from serving.services.inference_keys import hash_inference_key
from tests.browser.test_story import no_horizontal_scroll, sign_in
from tests.factories import make_adapter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_key_is_issued_a_grant_asked_and_approved_on_the_pages(
    new_page, screenshot, lena, alex, fred, legal, finance
):
    contracts = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")

    member = new_page()
    sign_in(member, "lena")
    member.get_by_role("link", name="Inference keys").click()
    member.get_by_label("Name", exact=True).fill("notebook")
    member.get_by_role("button", name="Issue key").click()
    secret = member.get_by_test_id("key-secret").inner_text()
    assert secret.startswith("lsk_")
    assert InferenceKey.objects.get().secret_sha256 == hash_inference_key(secret)
    assert no_horizontal_scroll(member)
    screenshot(member, "keys-issued")
    member.reload()
    assert secret not in member.content()

    asker = new_page()
    sign_in(asker, "fred")
    asker.goto("/departments/finance/keys/")
    asker.get_by_label("Adapter (its served name)").fill("legal-contracts")
    asker.get_by_label("Reason").fill("Check invoices against contract terms.")
    asker.get_by_role("button", name="Ask for a grant").click()
    assert asker.get_by_text("Asked for grant").count() == 1
    screenshot(asker, "keys-department")
    grant = AdapterGrant.objects.get()

    approver = new_page()
    sign_in(approver, "alex")
    approver.goto(f"/adapters/{contracts.pk}/")
    card = approver.get_by_test_id(f"grant-{grant.pk}")
    card.get_by_role("button", name="Approve").click()
    approver.wait_for_url(f"**/adapters/{contracts.pk}/**")
    assert AdapterGrant.objects.get().status == GrantStatus.APPROVED
    callers = approver.get_by_test_id("caller").all_inner_texts()
    assert any("finance" in row and f"grant #{grant.pk} by alex" in row for row in callers)
    approver.get_by_test_id("adapter-access").scroll_into_view_if_needed()
    screenshot(approver, "keys-adapter-callers")
