"""Issue 30, item 8: a leaver's pipeline tokens. The service-account tokens a
person minted keep working when they leave (their department owns them), so
offboarding lists them and offers to end them; OFFBOARDING_REVOKE_SERVICE_TOKENS
ends them at every offboarding (the admin, SCIM, the periodic SSO check)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.models import Ability, ApiToken, AuditEvent
from core.services.people import user_update
from core.services.service_accounts import service_account_create, service_account_token_create
from tests.conftest import actor
from tests.core.test_people_audited import change_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_browser(root):
    from django.test import Client

    browser = Client()
    browser.force_login(root)
    return browser


@pytest.fixture
def minted(alex, paula, legal):
    """alex minted a token of a Legal pipeline; paula minted another one."""
    account = service_account_create(actor=actor(alex), department=legal, name="nightly")
    tokens = {}
    for who in (alex, paula):
        token, secret = service_account_token_create(
            actor=actor(who), account=account, name=f"by-{who}", abilities=[Ability.READ_AUDIT]
        )
        token.secret = secret
        tokens[who.username] = token
    return tokens


def works(token) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.secret}")
    return client.get("/api/v1/audit-events/").status_code == 200


def test_the_admins_offboarding_lists_a_leavers_pipeline_tokens_and_offers_to_end_them(
    admin_browser, alex, minted
):
    response = admin_browser.post(
        f"/admin/auth/user/{alex.pk}/change/", change_form(alex, is_active=""), follow=True
    )

    page = response.content.decode()
    assert "Service-account tokens alex minted still work: legal/nightly" in page
    assert minted["alex"].prefix in page
    assert works(minted["alex"])  # the default keeps them: a department's pipeline runs on
    ended = AuditEvent.objects.get(action="user.access_ended")
    assert ended.details["service_account_tokens_kept"] == [
        {"prefix": minted["alex"].prefix, "name": "by-alex", "service_account": "legal/nightly"}
    ]
    change_page = admin_browser.get(f"/admin/auth/user/{alex.pk}/change/").content.decode()
    assert f"legal/nightly: by-alex ({minted['alex'].prefix}" in change_page

    admin_browser.post(
        "/admin/auth/user/",
        {"action": "revoke_minted_tokens", "_selected_action": [str(alex.pk)]},
    )

    assert not works(minted["alex"])
    assert works(minted["paula"])  # not the leaver's
    revoked = AuditEvent.objects.get(action="user.minted_tokens_revoked")
    assert revoked.object_id == str(alex.pk)
    assert [t["prefix"] for t in revoked.details["revoked_service_account_tokens"]] == [
        minted["alex"].prefix
    ]
    assert "none" in admin_browser.get(f"/admin/auth/user/{alex.pk}/change/").content.decode()


@pytest.mark.parametrize("via", ["admin", "sso-check"])
def test_the_policy_ends_a_leavers_pipeline_tokens_at_offboarding(
    via, settings, admin_browser, alex, minted
):
    settings.OFFBOARDING_REVOKE_SERVICE_TOKENS = True
    if via == "admin":
        admin_browser.post(f"/admin/auth/user/{alex.pk}/change/", change_form(alex, is_active=""))
    else:  # what the periodic check does when the provider refuses alex's refresh token
        user_update(actor=None, user=alex, via="sso-check", is_active=False)

    assert not works(minted["alex"])
    assert works(minted["paula"])
    ended = AuditEvent.objects.get(action="user.access_ended")
    assert [t["prefix"] for t in ended.details["revoked_service_account_tokens"]] == [
        minted["alex"].prefix
    ]
    assert ApiToken.objects.get(pk=minted["alex"].pk).revoked_at is not None


def test_only_platform_admins_end_another_persons_minted_tokens(paula, alex, minted):
    from core.errors import NotAuthorized
    from core.services.service_accounts import minted_tokens_revoke

    with pytest.raises(NotAuthorized):
        minted_tokens_revoke(actor=actor(paula), user=alex)
    assert works(minted["alex"])
