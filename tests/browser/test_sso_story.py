"""Single sign-on in a real browser against a real OpenID provider (npm's
oidc-provider on loopback): people sign in at the provider and land with the
role their groups map to; an approver approves a colleague's version (four
eyes); the approver's group is then changed at the provider, and after signing
out (at the provider too) and in again the role is gone and a page says why."""

from __future__ import annotations

import re

import pytest

from core.models import Membership
from registry.models import AdapterVersion
from sso.models import Identity
from tests.factories import make_adapter, make_version
from tests.sso.conftest import PASSWORD, oidc_provider, sso  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.oidc, pytest.mark.django_db(transaction=True)]


def sign_in_at_provider(page, username: str) -> None:
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.wait_for_url(re.compile(r"127\.0\.0\.1:\d+/interaction/"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def test_provider_sign_in_maps_groups_to_roles_and_a_removed_group_takes_the_role(
    sso,  # noqa: F811 - the fixture imported above
    new_page,
    screenshot,
    legal,
):
    sso.provider.put_account("sub-sam", username="sam", password=PASSWORD, groups=["legal-team"])
    sso.provider.put_account(
        "sub-ada", username="ada", password=PASSWORD, groups=["legal-approvers"]
    )

    # A Legal member signs in at the provider and lands as a member.
    member = new_page()
    member.goto("/login/")
    screenshot(member, "sso-login")
    sign_in_at_provider(member, "sam")
    member.wait_for_url(re.compile(r"localhost:\d+/$"))
    assert "Legal · member" in member.get_by_text("Legal · member").inner_text()
    assert member.get_by_role("link", name=re.compile("Review queue")).count() == 0

    sam = Identity.objects.get(subject="sub-sam").user
    contracts = make_adapter(sam, legal)
    version = make_version(sam, contracts)
    member.goto(f"/versions/{version.pk}/")
    member.get_by_role("button", name="Submit for review").click()
    member.locator(".alert-success", has_text="submitted for review").wait_for()
    assert member.get_by_role("button", name="Approve").count() == 0

    # A Legal approver signs in the same way and approves it: a different person.
    approver = new_page()
    sign_in_at_provider(approver, "ada")
    approver.wait_for_url(re.compile(r"localhost:\d+/$"))
    approver.get_by_text("Legal · approver").wait_for()
    approver.get_by_role("link", name=re.compile("Review queue")).click()
    approver.get_by_role("button", name=f"Approve v{version.number}").click()
    approver.locator(".alert-success", has_text="approved").wait_for()
    version.refresh_from_db()
    ada = Identity.objects.get(subject="sub-ada").user
    assert (version.status, version.reviewed_by, version.submitted_by) == ("approved", ada, sam)

    # The provider moves the approver to a group the registry does not know.
    sso.provider.set_groups("sub-ada", ["marketing"])
    approver.get_by_role("button", name="Sign out").click()
    approver.get_by_role("button", name="Yes, sign me out").click()  # the provider's page
    approver.wait_for_url(re.compile(r"localhost:\d+/login/$"))

    sign_in_at_provider(approver, "ada")  # the provider asks for the password again
    approver.wait_for_url(re.compile(r"/oidc/no-access/$"))
    notice = approver.get_by_test_id("no-access")
    assert "none of the groups" in notice.inner_text()
    assert "Not mapped to any department: marketing." in notice.inner_text()
    assert approver.get_by_role("link", name=re.compile("Review queue")).count() == 0
    assert not Membership.objects.filter(user=ada).exists()
    screenshot(approver, "sso-no-access")

    response = approver.goto(f"/versions/{version.pk}/")
    assert response.status == 404
    assert AdapterVersion.objects.get(pk=version.pk).status == "approved"
