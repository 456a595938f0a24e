"""Sign-in through a real OpenID provider, and the groups it sends becoming
department roles: created on first sign-in, synced (and audited) at every one."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.models import AuditEvent, Membership, Role
from sso.models import Identity
from tests.conftest import PASSWORD as PASSWORD_LOCAL
from tests.sso.conftest import provider_sign_in, replace_query

pytestmark = [pytest.mark.oidc, pytest.mark.django_db]
User = get_user_model()


def roles_of(username: str) -> dict[str, str]:
    return dict(
        Membership.objects.filter(user__username=username).values_list("department__slug", "role")
    )


def test_first_sign_in_creates_the_person_with_the_mapped_role(sso, ada, legal):
    client = Client()
    response = provider_sign_in(client, sso.provider, "ada")

    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(username="ada")
    assert roles_of("ada") == {"legal": Role.APPROVER}
    assert not user.has_usable_password()
    identity = Identity.objects.get(user=user)
    assert (identity.issuer, identity.subject, identity.groups) == (
        sso.provider.issuer,
        "sub-ada",
        ["legal-approvers"],
    )
    added = AuditEvent.objects.get(action="membership.added")
    assert added.details == {"user": "ada", "via": "sso", "groups": ["legal-approvers"]}
    assert added.to_state == Role.APPROVER and added.department == legal
    assert AuditEvent.objects.filter(action="user.created", details__via="sso").count() == 1
    dashboard = client.get("/")
    assert dashboard.status_code == 200
    assert "Legal · approver" in dashboard.content.decode()


def test_the_authorization_request_carries_pkce_state_and_nonce(sso):
    start = Client().get("/oidc/authenticate/")
    query = parse_qs(urlparse(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43  # base64url of a SHA-256
    assert len(query["state"][0]) >= 32 and len(query["nonce"][0]) >= 32
    assert query["scope"] == ["openid email profile groups"]


def test_a_group_removed_at_the_provider_takes_the_role_at_the_next_sign_in(sso, ada, legal):
    provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {"legal": Role.APPROVER}

    sso.provider.set_groups("sub-ada", ["legal-team"])
    provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {"legal": Role.MEMBER}
    changed = AuditEvent.objects.get(action="membership.changed")
    assert (changed.from_state, changed.to_state) == (Role.APPROVER, Role.MEMBER)

    sso.provider.set_groups("sub-ada", [])
    response = provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {}
    assert response["Location"] == "/oidc/no-access/"
    removed = AuditEvent.objects.get(action="membership.removed")
    assert removed.details["via"] == "sso" and removed.from_state == Role.MEMBER
    assert User.objects.filter(username__startswith="ada").count() == 1


def test_the_strongest_of_several_mapped_groups_wins(sso, ada, legal):
    sso.provider.set_groups("sub-ada", ["legal-team", "legal-approvers"])
    provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {"legal": Role.APPROVER}


def test_memberships_in_departments_the_map_does_not_name_are_left_alone(sso, ada, legal, finance):
    provider_sign_in(Client(), sso.provider, "ada")
    Membership.objects.create(user=User.objects.get(username="ada"), department=finance)
    sso.provider.set_groups("sub-ada", [])
    provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {"finance": Role.MEMBER}


def test_the_admin_group_grants_and_then_revokes_platform_admin(sso, ada, legal):
    sso.provider.set_groups("sub-ada", ["platform-admins"])
    provider_sign_in(Client(), sso.provider, "ada")
    assert User.objects.get(username="ada").is_staff
    sso.provider.set_groups("sub-ada", ["legal-team"])
    provider_sign_in(Client(), sso.provider, "ada")
    assert not User.objects.get(username="ada").is_staff
    actions = list(
        AuditEvent.objects.filter(action__startswith="user.admin")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == ["user.admin_granted", "user.admin_revoked"]


def test_an_unknown_group_gives_no_role_and_a_page_that_says_so(sso, legal):
    sso.provider.put_account(
        "sub-mo", username="mo", password="provider-password-1", groups=["marketing-team"]
    )
    client = Client()
    response = provider_sign_in(client, sso.provider, "mo")
    assert response["Location"] == "/oidc/no-access/"
    assert roles_of("mo") == {}
    page = client.get("/oidc/no-access/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "none of the groups" in text and "marketing-team" in text
    assert "Not mapped to any department: marketing-team." in text


def test_a_local_account_of_the_same_name_is_never_taken_over(sso, ada, legal, lena):
    User.objects.filter(pk=lena.pk).update(username="ada")
    provider_sign_in(Client(), sso.provider, "ada")
    assert roles_of("ada") == {"legal": Role.MEMBER}  # lena's, untouched
    assert roles_of("ada-2") == {"legal": Role.APPROVER}


def test_a_forged_state_is_refused_with_a_page_that_says_why(sso, ada, legal):
    client = Client()
    response = provider_sign_in(
        client, sso.provider, "ada", before_callback=lambda url: replace_query(url, state="forged")
    )
    assert response.status_code == 400
    assert "state does not match" in response.content.decode()
    assert not User.objects.filter(username="ada").exists()
    assert client.get("/").status_code == 302


def test_a_nonce_other_than_this_sign_ins_is_refused(sso, ada, legal):
    response = provider_sign_in(
        Client(),
        sso.provider,
        "ada",
        tamper_authorize=lambda url: replace_query(url, nonce="n" * 32),
    )
    assert response.status_code == 400
    assert "nonce is not the one this sign-in sent" in response.content.decode()
    assert not User.objects.filter(username="ada").exists()


def test_an_expired_id_token_is_refused(sso, ada, legal):
    # A provider whose clock is 2 minutes behind mints 60 s ID tokens that are
    # already expired here, beyond the 30 s allowance for clock skew.
    sso.provider.set_ttl(IdToken=60)
    sso.provider.set_clock_offset(-120)
    response = provider_sign_in(Client(), sso.provider, "ada")
    assert response.status_code == 400
    assert "The ID token has expired." in response.content.decode()
    assert not User.objects.filter(username="ada").exists()

    sso.provider.set_clock_offset(-20)  # the control: within the allowance, accepted
    assert provider_sign_in(Client(), sso.provider, "ada").status_code == 302


def test_a_discovery_document_for_another_issuer_is_not_trusted(sso, ada, legal):
    # The same provider reached under another name: its document names 127.0.0.1.
    sso.configure(OIDC_ISSUER=sso.provider.issuer.replace("127.0.0.1", "localhost"))
    response = Client().get("/oidc/authenticate/")
    assert response.status_code == 503
    assert "describes another issuer" in response.content.decode()


def test_a_provider_that_is_down_breaks_sign_in_only(sso, lena):
    from tests.support.s3_server import free_port

    sso.configure(OIDC_ISSUER=f"http://127.0.0.1:{free_port()}")
    response = Client().get("/oidc/authenticate/")
    assert response.status_code == 503
    assert "cannot be reached" in response.content.decode()
    local = Client()
    local.post("/login/", {"username": "lena", "password": PASSWORD_LOCAL})
    assert local.get("/").status_code == 200


def test_a_wrong_client_secret_fails_the_code_exchange_with_a_clear_page(sso, ada, legal):
    sso.configure(OIDC_RP_CLIENT_SECRET="not-the-secret")
    response = provider_sign_in(Client(), sso.provider, "ada")
    assert response.status_code == 502
    assert "did not accept this sign-in (HTTP 401)" in response.content.decode()
    assert not User.objects.filter(username="ada").exists()


def test_platform_admins_see_identities_read_only_in_the_admin(sso, ada, legal, root):
    provider_sign_in(Client(), sso.provider, "ada")
    admin = Client()
    admin.force_login(root)
    page = admin.get("/admin/sso/identity/")
    assert page.status_code == 200 and "sub-ada" in page.content.decode()
    identity = Identity.objects.get(subject="sub-ada")
    assert admin.post(f"/admin/sso/identity/{identity.pk}/delete/").status_code == 403


def test_userinfo_about_another_person_is_refused(sso, ada, legal, monkeypatch):
    # A stand-in for a provider that answers userinfo for the wrong account: the
    # real provider cannot be made to, so its real answer is altered on the way.
    from sso.backends import OIDCBackend

    real = OIDCBackend.get_userinfo

    def someone_else(self, *args):
        return {**real(self, *args), "sub": "sub-mallory"}

    monkeypatch.setattr(OIDCBackend, "get_userinfo", someone_else)
    response = provider_sign_in(Client(), sso.provider, "ada")
    assert response.status_code == 400
    assert "The userinfo answer is about another person." in response.content.decode()
    assert not User.objects.filter(username="ada").exists()


def test_a_person_deactivated_here_cannot_sign_in_through_the_provider(sso, ada, legal):
    provider_sign_in(Client(), sso.provider, "ada")
    User.objects.filter(username="ada").update(is_active=False)
    sso.provider.set_groups("sub-ada", ["platform-admins"])
    client = Client()
    response = provider_sign_in(client, sso.provider, "ada")
    assert response.status_code == 401
    assert "This account is disabled here." in response.content.decode()
    assert not User.objects.get(username="ada").is_staff
    assert client.get("/")["Location"].startswith("/login/")


def test_a_code_from_another_issuer_is_never_exchanged(sso, ada, legal):
    # The provider names itself in the redirect (RFC 9207); a mix-up swaps the name.
    client = Client()
    response = provider_sign_in(
        client,
        sso.provider,
        "ada",
        before_callback=lambda url: replace_query(url, iss="https://evil.example"),
    )
    assert response.status_code == 400
    assert "comes from another issuer" in response.content.decode()
    assert not User.objects.filter(username="ada").exists()
    # The state was not spent on it: the genuine answer would still be accepted.
    assert client.session["oidc_states"]


def test_an_email_changed_at_the_provider_is_audited(sso, sam, legal):
    from tests.sso.conftest import PASSWORD as PROVIDER_PASSWORD

    provider_sign_in(Client(), sso.provider, "sam")
    user = User.objects.get(username="sam")
    assert user.email == "sam@example.org"
    sso.provider.put_account(
        "sub-sam",
        username="sam",
        password=PROVIDER_PASSWORD,
        groups=["legal-team"],
        email="sam.new@example.org",
    )

    provider_sign_in(Client(), sso.provider, "sam")

    user.refresh_from_db()
    assert user.email == "sam.new@example.org"
    event = AuditEvent.objects.get(action="user.changed", object_id=str(user.pk))
    assert event.details["via"] == "sso"
    assert event.details["changes"] == {"email": ["sam@example.org", "sam.new@example.org"]}
