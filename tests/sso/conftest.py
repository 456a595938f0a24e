"""Single sign-on against a real OpenID provider (tests/support/oidc_provider.py).

`sso` turns SSO on for one test, configured from environment variables exactly
as production is (sso.conf.from_env). `provider_sign_in` drives the provider's
own login page over HTTP with `requests` and hands the redirect back to Django's
test client, so the registry exchanges a real code for real signed tokens; the
browser tests (tests/browser/test_sso_story.py) do the same in Chromium.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlparse, urlunparse

import pytest
import requests

from sso import discovery
from sso.conf import from_env
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, node_available

GROUP_MAP = "legal-approvers=legal:approver,legal-team=legal:member,platform-admins=admin"
PASSWORD = "provider-password-1"


@pytest.fixture(scope="session")
def oidc_provider(request):
    missing = node_available()
    if missing and os.environ.get("REQUIRE_OIDC") == "1":
        pytest.fail(f"REQUIRE_OIDC=1 but {missing}")
    if missing:
        pytest.skip(missing)
    from tests.support.oidc_provider import install_dependencies

    install_dependencies()
    live_server = request.getfixturevalue("live_server")
    # Not under pytest's basetemp: other pytest runs on the machine prune old
    # basetemps, and the provider reads its account store for the whole session.
    workdir = Path(tempfile.mkdtemp(prefix="oidc-provider-"))
    provider = OidcProvider(workdir, ["http://testserver", live_server.url])
    provider.start()
    yield provider
    provider.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Sso:
    provider: OidcProvider
    settings: object
    monkeypatch: object

    def configure(self, **env: str) -> None:
        """(Re)applies settings from these environment variables, as start-up does."""
        base = {
            "OIDC_ISSUER": self.provider.issuer,
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_RP_SCOPES": "openid email profile groups",
            "OIDC_GROUP_MAP": GROUP_MAP,
            "OIDC_PROVIDER_NAME": "Test IdP",
        }
        for name, value in {**base, **env}.items():
            self.monkeypatch.setenv(name, value)
        for name, value in from_env().items():
            setattr(self.settings, name, value)
        discovery.forget()


@pytest.fixture
def sso(oidc_provider, settings, monkeypatch):
    oidc_provider.set_ttl()
    helper = Sso(oidc_provider, settings, monkeypatch)
    helper.configure()
    yield helper
    discovery.forget()


@pytest.fixture
def ada(sso):
    """A Legal approver at the provider (no account in the registry yet)."""
    sso.provider.put_account(
        "sub-ada", username="ada", password=PASSWORD, groups=["legal-approvers"]
    )
    return "sub-ada"


@pytest.fixture
def sam(sso):
    """A Legal member at the provider."""
    sso.provider.put_account("sub-sam", username="sam", password=PASSWORD, groups=["legal-team"])
    return "sub-sam"


def _replace_query(url: str, **params: str) -> str:
    parts = urlparse(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(params)
    return urlunparse(parts._replace(query=urlencode(query)))


def provider_sign_in(
    client,
    provider: OidcProvider,
    username: str,
    *,
    tamper_authorize=None,
    before_callback=None,
    browser: requests.Session | None = None,
    start_path: str = "/oidc/authenticate/?next=/",
):
    """Signs in at the provider; returns the registry's answer to the callback.
    `tamper_authorize(url) -> url` changes the authorization request on its way
    to the provider; `before_callback(url) -> url` the redirect on its way back."""
    start = client.get(start_path, headers={"Accept": "text/html"})
    assert start.status_code == 302, start
    authorize = start["Location"]
    assert authorize.startswith(provider.issuer + "/auth?")
    if tamper_authorize:
        authorize = tamper_authorize(authorize)
    if browser is None:
        browser = requests.Session()
        browser.trust_env = False  # never through a proxy to loopback
    answer = browser.get(authorize, allow_redirects=False, timeout=10)
    location = _follow(browser, provider, answer)
    if location is None:  # the login page
        page = browser.get(urljoin(provider.issuer, answer.headers["Location"]), timeout=10)
        action = page.text.split('action="', 1)[1].split('"', 1)[0]
        answer = browser.post(
            urljoin(provider.issuer, action),
            data={"username": username, "password": PASSWORD},
            allow_redirects=False,
            timeout=10,
        )
        assert answer.status_code == 303, answer.text
        location = _follow(browser, provider, answer)
    assert location and location.startswith("http://testserver/oidc/callback/?"), location
    if before_callback:
        location = before_callback(location)
    return client.get(location.removeprefix("http://testserver"))


def _follow(browser, provider, answer):
    """Follows the provider's redirects until they leave it; None at its login page."""
    for _ in range(10):
        location = answer.headers.get("Location")
        assert location, (answer.status_code, answer.text[:500])
        target = urljoin(provider.issuer, location)
        if not target.startswith(provider.issuer):
            return target
        if "/interaction/" in target:
            return None
        answer = browser.get(target, allow_redirects=False, timeout=10)
    raise AssertionError("too many redirects at the provider")


def replace_query(url: str, **params: str) -> str:
    return _replace_query(url, **params)
