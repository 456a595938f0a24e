"""Uploads by a signed-in person (session cookie, CSRF enforced as in a
browser) stream like a pipeline's: the token is taken from the X-CSRFToken
header before the body is read. Without a valid token nothing is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from registry.models import AdapterVersion
from registry.storage import LocalArtifactStore, S3ArtifactStore
from tests.factories import make_adapter
from tests.support.adapters import AdapterSpec, tar_gz_bytes

pytestmark = pytest.mark.django_db

API = "/api/v1/adapters/{pk}/versions/"
WEB = "/adapters/{pk}/versions/"


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts")


@pytest.fixture
def browser(lena, contracts):
    """Lena signed in, with the CSRF cookie the adapter page sets."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(lena)
    assert client.get(f"/adapters/{contracts.pk}/").status_code == 200
    assert client.cookies[django_settings.CSRF_COOKIE_NAME].value
    return client


def csrf_cookie(client) -> str:
    return client.cookies[django_settings.CSRF_COOKIE_NAME].value


@pytest.fixture
def written(monkeypatch):
    """Keys written through streaming writers (open_write) or put_file."""
    keys = []
    for store_class in (LocalArtifactStore, S3ArtifactStore):
        for method in ("open_write", "put_file"):
            original = getattr(store_class, method)

            def spying(self, key, *args, original=original, method=method, **kwargs):
                keys.append((method, key.rpartition("/")[2]))
                return original(self, key, *args, **kwargs)

            monkeypatch.setattr(store_class, method, spying)
    return keys


def archive(seed: int) -> SimpleUploadedFile:
    return SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(AdapterSpec(seed=seed).files()))


def assert_nothing_stored(tmp_path):
    assert not AdapterVersion.objects.exists()
    root = tmp_path / "artifacts"
    assert not root.exists() or not [p for p in root.rglob("*") if p.is_file()]
    staging = Path(django_settings.INGEST_STAGING_DIR)
    assert not staging.exists() or list(staging.iterdir()) == []


@pytest.mark.parametrize("url", [API, WEB], ids=["api", "web"])
@pytest.mark.parametrize(
    "token", [None, "wrong-token-" + "x" * 20, ""], ids=["no-token", "wrong", "empty"]
)
def test_a_session_upload_without_a_valid_token_is_refused_before_anything_is_stored(
    url, token, browser, contracts, written, tmp_path
):
    headers = {} if token is None else {"X-CSRFToken": token}

    response = browser.post(url.format(pk=contracts.pk), {"files": [archive(1)]}, headers=headers)

    assert response.status_code == 403
    assert written == []
    assert_nothing_stored(tmp_path)


@pytest.mark.parametrize("url", [API, WEB], ids=["api", "web"])
def test_a_token_in_the_form_and_a_wrong_one_in_the_header_is_refused(
    url, browser, contracts, written, tmp_path
):
    # The header is what a streamed upload is judged by; the body is never read.
    response = browser.post(
        url.format(pk=contracts.pk),
        {"files": [archive(2)], "csrfmiddlewaretoken": csrf_cookie(browser)},
        headers={"X-CSRFToken": "x" * 32},
    )

    assert response.status_code == 403
    assert written == []
    assert_nothing_stored(tmp_path)


@pytest.mark.parametrize("url", [API, WEB], ids=["api", "web"])
def test_a_session_upload_with_the_header_token_streams_into_the_store(
    url, browser, contracts, written
):
    files = AdapterSpec(seed=3).files()

    response = browser.post(
        url.format(pk=contracts.pk),
        {"files": [SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(files))]},
        headers={"X-CSRFToken": csrf_cookie(browser), "HX-Request": "true"},
    )

    assert response.status_code in (201, 204), response.content
    assert AdapterVersion.objects.filter(adapter=contracts).count() == 1
    assert sorted(written) == sorted(("open_write", name) for name in files)


def test_a_form_field_token_still_works_and_takes_the_staging_path(browser, contracts, written):
    # A browser without JavaScript posts the token in the form: the check must
    # read the body to find it, so the upload is staged, then stored.
    files = AdapterSpec(seed=4).files()

    response = browser.post(
        WEB.format(pk=contracts.pk),
        {
            "files": [SimpleUploadedFile("adapter.tar.gz", tar_gz_bytes(files))],
            "csrfmiddlewaretoken": csrf_cookie(browser),
        },
        headers={"Origin": "http://testserver"},
    )

    assert response.status_code == 302
    assert sorted(written) == sorted(("put_file", name) for name in files)


@pytest.fixture
def bodies_parsed(monkeypatch):
    """Every multipart body Django parses (request.POST / request.FILES)."""
    from django.http import multipartparser

    parsed = []
    original = multipartparser.MultiPartParser.parse

    def spying(self):
        parsed.append(True)
        return original(self)

    monkeypatch.setattr(multipartparser.MultiPartParser, "parse", spying)
    return parsed


@pytest.mark.parametrize(
    "headers",
    [{}, {"Origin": "https://attacker.example"}, {"Origin": "null"}],
    ids=["no-origin", "cross-site", "opaque-origin"],
)
def test_a_form_post_without_the_header_is_refused_before_its_body_unless_same_origin(
    headers, browser, contracts, written, bodies_parsed, tmp_path
):
    # A cross-site form carries the attacker's Origin (browsers always send one
    # with a POST): refused on it, the body never parsed. With no Origin at all
    # (no browser does that) the body is not read either.
    response = browser.post(
        WEB.format(pk=contracts.pk),
        {"files": [archive(5)], "csrfmiddlewaretoken": csrf_cookie(browser)},
        headers=headers,
    )

    assert response.status_code == 403
    assert bodies_parsed == []
    assert written == []
    assert_nothing_stored(tmp_path)


def test_a_same_origin_form_post_is_parsed_to_find_its_token(browser, contracts, bodies_parsed):
    response = browser.post(
        WEB.format(pk=contracts.pk),
        {"files": [archive(6)], "csrfmiddlewaretoken": csrf_cookie(browser)},
        headers={"Origin": "http://testserver"},
    )

    assert response.status_code == 302
    assert bodies_parsed == [True]
