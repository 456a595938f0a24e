"""The product's own 400/403/404/500 pages, never Django's debug pages: a
visitor sees the brand and a way back, and no URL patterns or settings."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.views import defaults

pytestmark = pytest.mark.django_db

DEBUG_MARKS = ("Using the URLconf", "Traceback", "DJANGO_SETTINGS_MODULE", "technical_500")


def _branded(body: str) -> None:
    assert "LoRA Registry" in body
    for mark in DEBUG_MARKS:
        assert mark not in body


def test_an_unknown_page_is_the_branded_404(web_lena):
    response = web_lena.get("/no-such-page/")
    assert response.status_code == 404
    body = response.content.decode()
    _branded(body)
    assert "Not found" in body
    assert "Back to the dashboard" in body


def test_a_refusal_is_the_branded_403():
    request = RequestFactory().get("/")
    response = defaults.permission_denied(request, PermissionDenied("Not yours."))
    assert response.status_code == 403
    body = response.content.decode()
    _branded(body)
    assert "Not yours." in body


def test_a_server_error_is_the_branded_500_without_a_request_context():
    # Django renders 500.html with an empty context: the page must stand alone.
    response = defaults.server_error(RequestFactory().get("/"))
    assert response.status_code == 500
    body = response.content.decode()
    _branded(body)
    assert "Something went wrong" in body


def test_a_bad_request_is_the_branded_400():
    response = defaults.bad_request(RequestFactory().get("/"), Exception("x"))
    assert response.status_code == 400
    _branded(response.content.decode())


def test_a_raised_exception_reaches_the_visitor_as_the_500_page(settings, web_lena, monkeypatch):
    from registry.web import views

    def broken(*args, **kwargs):
        raise RuntimeError("/srv/secret/path exploded")

    monkeypatch.setattr(views.queries, "my_departments", broken)
    web_lena.raise_request_exception = False
    response = web_lena.get("/")
    assert response.status_code == 500
    body = response.content.decode()
    _branded(body)
    assert "/srv/secret/path" not in body


def test_make_run_serves_pages_with_debug_off_unless_a_developer_opts_in():
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "run.sh").read_text()
    assert 'export DJANGO_DEBUG="${DJANGO_DEBUG:-false}"' in script
    assert 'DJANGO_SECURE_SSL_REDIRECT="${DJANGO_SECURE_SSL_REDIRECT:-false}"' in script
