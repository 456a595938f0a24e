"""core.web: the form-error context manager and the safe `next` redirect."""

import pytest
from django import forms
from django.test import RequestFactory

from core.errors import Conflict, NotFound
from core.web import errors_on, safe_next


class _Form(forms.Form):
    name = forms.CharField(required=False)


def test_an_application_error_becomes_a_form_error_and_its_status():
    form = _Form({"name": "x"})
    assert form.is_valid()
    with errors_on(form) as outcome:
        raise Conflict("Version 3 already has these files.")
    assert outcome.failed and outcome.status == 409
    assert form.non_field_errors() == ["Version 3 already has these files."]


def test_a_call_that_succeeds_leaves_the_form_clean():
    form = _Form({"name": "x"})
    form.is_valid()
    with errors_on(form) as outcome:
        pass
    assert not outcome.failed and outcome.status == 200 and not form.errors


def test_not_found_still_escapes_to_become_the_404_page():
    form = _Form({})
    form.is_valid()
    with pytest.raises(NotFound), errors_on(form):
        raise NotFound("Adapter not found.")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/versions/3/", "/versions/3/"),
        ("https://evil.example/", "/fallback/"),
        ("//evil.example/", "/fallback/"),
        ("", "/fallback/"),
    ],
)
def test_next_stays_on_this_site(target, expected):
    request = RequestFactory().post("/x/", {"next": target}, HTTP_HOST="testserver")
    assert safe_next(request, "/fallback/") == expected
