"""The periodic check of SSO people against the real OpenID provider
(tests/support/oidc/, npm oidc-provider): a person the provider no longer knows
is deactivated, with their sessions and tokens, without signing in again; a
lost group is noticed from userinfo; an unreachable provider changes nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client

from core.models import Ability, ApiToken, AuditEvent, Membership
from core.services.tokens import token_create
from sso.checks import sso_check_due, unseal
from sso.models import Identity
from sso.tasks import check_identities
from tests.conftest import actor
from tests.sso.conftest import provider_sign_in

pytestmark = [pytest.mark.oidc, pytest.mark.django_db]
User = get_user_model()


@pytest.fixture
def signed_in_sam(sso, sam, legal):
    browser = Client()
    provider_sign_in(browser, sso.provider, "sam")
    person = User.objects.get(username="sam")
    token, secret = token_create(
        actor=actor(person), department=legal, name="nightly", abilities=[Ability.READ_AUDIT]
    )
    return person, browser, token


def test_sign_in_keeps_the_refresh_token_encrypted(signed_in_sam):
    person, _, _ = signed_in_sam
    sealed = Identity.objects.get(user=person).refresh_token_encrypted
    assert sealed and unseal(sealed) and unseal(sealed) not in sealed


def test_a_person_still_at_the_provider_stays(signed_in_sam, legal):
    person, browser, token = signed_in_sam
    before = Identity.objects.get(user=person).refresh_token_encrypted
    assert sso_check_due() == {"active": 1}
    person.refresh_from_db()
    assert person.is_active
    identity = Identity.objects.get(user=person)
    assert identity.check_result == "active" and identity.checked_at is not None
    assert identity.refresh_token_encrypted  # kept (rotated or not)
    assert before
    assert sso_check_due() == {}  # not due again within the interval


def test_a_person_gone_at_the_provider_is_deactivated_with_sessions_and_tokens(
    signed_in_sam, sso, legal, settings
):
    person, browser, token = signed_in_sam
    assert Session.objects.count() == 1
    sso.provider.remove_account("sub-sam")

    assert check_identities.apply().get() == {"gone": 1}

    person.refresh_from_db()
    assert not person.is_active
    assert Session.objects.count() == 0
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    gone = AuditEvent.objects.get(action="user.gone_at_provider")
    assert "invalid_grant" in gone.details["reason"]
    assert AuditEvent.objects.get(action="user.access_ended").details["revoked_tokens"] == [
        token.prefix
    ]
    assert Identity.objects.get(user=person).check_result == "gone"
    assert browser.get(f"/api/v1/departments/{legal.slug}/").status_code in (401, 403)


def test_a_group_lost_at_the_provider_is_noticed_without_a_sign_in(signed_in_sam, sso, legal):
    person, _, token = signed_in_sam
    assert Membership.objects.filter(user=person, department=legal).exists()
    sso.provider.set_groups("sub-sam", [])
    assert sso_check_due() == {"active": 1}
    assert not Membership.objects.filter(user=person).exists()
    assert AuditEvent.objects.get(action="membership.removed").details["via"] == "sso-check"


def test_an_unreachable_provider_deactivates_nobody(signed_in_sam, settings):
    person, _, _ = signed_in_sam
    settings.OIDC_OP_TOKEN_ENDPOINT = "http://127.0.0.1:9/token"
    assert sso_check_due() == {"error": 1}
    person.refresh_from_db()
    assert person.is_active
    assert Identity.objects.get(user=person).check_result.startswith("error: token endpoint")


def test_a_wrong_client_secret_deactivates_nobody(signed_in_sam, settings):
    person, _, _ = signed_in_sam
    settings.OIDC_RP_CLIENT_SECRET = "not-the-secret-" + "y" * 20
    assert sso_check_due() == {"error": 1}
    person.refresh_from_db()
    assert person.is_active
    assert "invalid_client" in Identity.objects.get(user=person).check_result


def test_scim_managed_people_and_the_check_switched_off_are_skipped(signed_in_sam, settings):
    person, _, _ = signed_in_sam
    settings.OIDC_CHECK_INTERVAL_SECONDS = 0
    assert check_identities.apply().get() == {}
    settings.OIDC_CHECK_INTERVAL_SECONDS = 3600
    from sso.models import ScimUser

    ScimUser.objects.create(user=person, scim_id="x-1")
    assert sso_check_due() == {}
