"""A first sign-in through the real OpenID provider links to a SCIM-provisioned
account only on an immutable claim: the subject (`sub`), or OIDC_LINK_CLAIM,
matched against SCIM's externalId. A `preferred_username` that names a
provisioned account (many providers let people choose theirs) links nothing
and creates nothing: the page says why and the refusal is audited."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.models import AuditEvent
from sso.models import Identity, ScimUser
from tests.sso.conftest import PASSWORD, provider_sign_in

pytestmark = [pytest.mark.oidc, pytest.mark.django_db]
User = get_user_model()


def provisioned(username: str, external_id: str, legal) -> object:
    """An account the provider pushed through SCIM, never signed in."""
    user = User.objects.create_user(username=username)
    user.set_unusable_password()
    user.save()
    ScimUser.objects.create(user=user, scim_id=f"scim-{username}", external_id=external_id)
    return user


# The provider's account store lives for the whole session and its login page
# finds people by username: each test uses names no other test does.


def test_a_chosen_username_that_names_a_provisioned_account_links_nothing(sso, legal):
    ivy = provisioned("ivy", "sub-ivy", legal)
    # Someone else at the provider, who set their username to "ivy".
    sso.provider.put_account("sub-mallory", username="ivy", password=PASSWORD, groups=[])

    response = provider_sign_in(Client(), sso.provider, "ivy")
    sso.provider.remove_account("sub-mallory")

    assert response.status_code == 400
    page = response.content.decode()
    assert "Sign-in refused." in page and "a username alone never links one" in page
    assert not Identity.objects.exists()
    assert list(User.objects.values_list("username", flat=True)) == ["ivy"]
    assert "_auth_user_id" not in response.wsgi_request.session
    refused = AuditEvent.objects.get(action="user.identity_link_refused")
    assert refused.object_id == str(ivy.pk)
    assert refused.details["subject"] == "sub-mallory"
    assert refused.details["claim"] == "preferred_username"
    assert not AuditEvent.objects.filter(action__in=["user.identity_linked", "user.created"])


def test_the_subject_matching_the_external_id_links_the_provisioned_account(sso, legal):
    jo = provisioned("jo", "sub-jo", legal)
    sso.provider.put_account("sub-jo", username="jo.k", password=PASSWORD, groups=[])

    response = provider_sign_in(Client(), sso.provider, "jo.k")

    assert response.status_code == 302
    assert Identity.objects.get(subject="sub-jo").user == jo
    assert AuditEvent.objects.filter(action="user.identity_linked").count() == 1


def test_a_configured_immutable_claim_links_where_the_subject_differs(sso, legal):
    kim = provisioned("kim", "oid-kim", legal)
    sso.provider.put_account(
        "pairwise-kim", username="kim", password=PASSWORD, groups=[], oid="oid-kim"
    )

    # Without OIDC_LINK_CLAIM the oid is not looked at, and the username alone is refused.
    assert provider_sign_in(Client(), sso.provider, "kim").status_code == 400
    sso.configure(OIDC_LINK_CLAIM="oid")
    response = provider_sign_in(Client(), sso.provider, "kim")

    assert response.status_code == 302, response.content[:500]
    assert Identity.objects.get(subject="pairwise-kim").user == kim
    assert User.objects.count() == 1
