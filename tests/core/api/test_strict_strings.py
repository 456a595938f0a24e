"""A string field of the API takes a JSON string, never a number turned into text."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", [42, 4.2])
def test_a_number_for_a_string_is_refused_and_named(as_lena, legal, name):
    response = as_lena.post(
        "/api/v1/adapters/",
        {"department": "legal", "name": name, "base_model": "tiny-llama"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["fields"]["name"] == [
        "Must be a string, not a JSON number."
    ]
    assert not legal.adapters.exists()


def test_the_same_body_with_strings_is_accepted(as_lena, legal):
    response = as_lena.post(
        "/api/v1/adapters/",
        {"department": "legal", "name": "42", "base_model": "tiny-llama"},
        format="json",
    )
    assert response.status_code == 201, response.content


def test_form_bodies_are_strings_and_still_work(lena, legal):
    from tests.conftest import client_for

    response = client_for(lena).post(
        "/api/v1/adapters/", {"department": "legal", "name": "nda", "base_model": "tiny-llama"}
    )
    assert response.status_code == 201, response.content
