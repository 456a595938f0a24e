"""What a sign-in through the provider leads to afterwards: the session ends with
the provider's token, sign-out ends the provider's session too, API tokens stop
with the department, and local passwords can be turned off."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urljoin, urlparse

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from core.models import Ability, Department, Membership
from core.services.tokens import token_create
from tests.conftest import PASSWORD, actor
from tests.sso.conftest import provider_sign_in

pytestmark = [pytest.mark.oidc, pytest.mark.django_db]
User = get_user_model()


def api_status(secret: str, department: Department) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client.get(f"/api/v1/departments/{department.slug}/").status_code


def test_a_token_stops_working_when_its_person_loses_the_department(sso, sam, legal):
    provider_sign_in(Client(), sso.provider, "sam")
    person = User.objects.get(username="sam")
    _, secret = token_create(
        actor=actor(person), department=legal, name="nightly", abilities=[Ability.REGISTER_VERSIONS]
    )
    assert api_status(secret, legal) == 200

    sso.provider.set_groups("sub-sam", [])
    provider_sign_in(Client(), sso.provider, "sam")
    assert not Membership.objects.filter(user=person).exists()
    assert api_status(secret, legal) == 401

    sso.provider.set_groups("sub-sam", ["legal-team"])  # back in the group: the token works again
    provider_sign_in(Client(), sso.provider, "sam")
    assert api_status(secret, legal) == 200


def test_the_session_ends_with_the_id_token_and_renewal_resyncs_the_groups(sso, sam, legal):
    # 5 s, not 2: the token must outlive its sign-in and the page load after it,
    # and the renewal's, in the light run (niced beside vLLM) too.
    sso.provider.set_ttl(IdToken=5)
    client = Client()
    browser = requests.Session()
    browser.trust_env = False
    provider_sign_in(client, sso.provider, "sam", browser=browser)
    assert client.get("/", headers={"Accept": "text/html"}).status_code == 200
    time.sleep(5.5)

    # A page load goes back to the provider without a prompt (its session is alive)...
    sso.provider.set_groups("sub-sam", [])
    bounce = client.get("/", headers={"Accept": "text/html"})
    assert bounce.status_code == 302
    query = parse_qs(urlparse(bounce["Location"]).query)
    assert bounce["Location"].startswith(sso.provider.issuer) and query["prompt"] == ["none"]
    answer = browser.get(bounce["Location"], allow_redirects=False, timeout=10)
    while answer.headers["Location"].startswith(("/", sso.provider.issuer)):
        answer = browser.get(
            urljoin(sso.provider.issuer, answer.headers["Location"]),
            allow_redirects=False,
            timeout=10,
        )
    back = client.get(answer.headers["Location"].removeprefix("http://testserver"))
    # ...and comes back re-synced: the group is gone, so is the role.
    assert back["Location"] == "/oidc/no-access/"
    assert not Membership.objects.filter(user__username="sam").exists()


def test_a_form_post_after_the_token_expired_is_not_authenticated(sso, sam, legal):
    sso.provider.set_ttl(IdToken=2)
    client = Client()
    provider_sign_in(client, sso.provider, "sam")
    time.sleep(2.5)
    response = client.post("/tokens/", {"name": "late"})
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get("/", headers={"Accept": "text/html"})["Location"].startswith("/login/")


def test_sign_out_ends_the_session_at_the_provider_too(sso, sam, legal):
    client = Client()
    browser = requests.Session()
    browser.trust_env = False
    provider_sign_in(client, sso.provider, "sam", browser=browser)
    id_token = client.session["oidc_id_token"]

    response = client.post("/logout/")
    target = urlparse(response["Location"])
    query = parse_qs(target.query)
    assert response["Location"].startswith(f"{sso.provider.issuer}/session/end?")
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert client.get("/")["Location"].startswith("/login/")

    # The provider's confirmation page, then back to the registry's login page.
    confirm = browser.get(response["Location"], timeout=10)
    form = confirm.text.split('id="op.logoutForm"', 1)[1]
    action = form.split('action="', 1)[1].split('"', 1)[0]
    xsrf = confirm.text.split('name="xsrf" value="', 1)[1].split('"', 1)[0]
    done = browser.post(
        urljoin(sso.provider.issuer, action),
        data={"xsrf": xsrf, "logout": "yes"},
        allow_redirects=False,
        timeout=10,
    )
    assert done.headers["Location"] == "http://testserver/login/"
    # The provider's session is over: signing in again asks for the password.
    again = browser.get(client.get("/oidc/authenticate/")["Location"], allow_redirects=False)
    assert "/interaction/" in again.headers["Location"]


def test_a_local_sign_in_signs_out_locally(sso, lena):
    client = Client()
    client.post("/login/", {"username": "lena", "password": PASSWORD})
    assert client.post("/logout/")["Location"] == "/login/"


def test_local_login_off_leaves_only_the_provider(sso, lena, root):
    sso.configure(LOCAL_LOGIN="false")
    page = Client().get("/login/").content.decode()
    assert "Sign in with Test IdP" in page
    assert 'name="password"' not in page
    refused = Client().post("/login/", {"username": "lena", "password": PASSWORD})
    assert refused.status_code == 403
    assert "Password sign-in is turned off" in refused.content.decode()
    client = Client()
    client.post("/admin/login/?next=/admin/", {"username": "root", "password": PASSWORD})
    assert "_auth_user_id" not in client.session  # no password backend at all

    sso.configure(LOCAL_LOGIN="true")  # the control: the same admin login works with it on
    client.post("/admin/login/?next=/admin/", {"username": "root", "password": PASSWORD})
    assert client.session["_auth_user_id"] == str(root.pk)


def test_with_sso_off_there_is_no_provider_button_and_no_oidc_pages(settings, lena):
    assert not settings.SSO_ENABLED
    assert "Sign in with" not in Client().get("/login/").content.decode()
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert Client().get("/oidc/callback/?code=x&state=y").status_code == 404


def test_renewal_without_a_session_at_the_provider_signs_the_person_out(sso, sam, legal):
    sso.provider.set_ttl(IdToken=2)
    client = Client()
    provider_sign_in(client, sso.provider, "sam")
    time.sleep(2.5)
    bounce = client.get("/activity/", headers={"Accept": "text/html"})
    # A browser without the provider's cookie: its session there is gone.
    stranger = requests.Session()
    stranger.trust_env = False
    answer = stranger.get(bounce["Location"], allow_redirects=False, timeout=10)
    while answer.headers["Location"].startswith(("/", sso.provider.issuer)):
        answer = stranger.get(
            urljoin(sso.provider.issuer, answer.headers["Location"]),
            allow_redirects=False,
            timeout=10,
        )
    back = client.get(answer.headers["Location"].removeprefix("http://testserver"))
    assert back.status_code == 401
    assert "The identity provider said: login_required" in back.content.decode()
    assert client.get("/")["Location"].startswith("/login/")


def test_an_htmx_request_after_expiry_reloads_the_page_it_came_from(sso, sam, legal):
    sso.provider.set_ttl(IdToken=2)
    client = Client()
    provider_sign_in(client, sso.provider, "sam")
    time.sleep(2.5)
    response = client.get(
        "/activity/",
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/tokens/"},
    )
    assert response["HX-Redirect"] == "http://testserver/tokens/"
    elsewhere = client.get(
        "/activity/",
        headers={"HX-Request": "true", "HX-Current-URL": "https://evil.example/"},
    )
    assert elsewhere["HX-Redirect"] == "/"
