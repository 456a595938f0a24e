import pytest

from registry.models import Adapter

pytestmark = pytest.mark.django_db


def test_it_creates_an_adapter_and_opens_it(web_lena, lena):
    response = web_lena.post(
        "/adapters/new/",
        {
            "department": "legal",
            "name": "nda-review",
            "base_model": "tiny-llama",
            "description": "Finds risky NDA clauses.",
        },
    )
    adapter = Adapter.objects.get()
    assert response["Location"] == f"/adapters/{adapter.pk}/"
    assert adapter.served_name == "nda-review"
    assert list(adapter.owners.all()) == [lena]


def test_it_explains_what_is_wrong(web_lena, contracts):
    response = web_lena.post(
        "/adapters/new/",
        {"department": "legal", "name": "contracts", "base_model": "tiny-llama"},
    )
    assert response.status_code == 409
    assert b"Adapter with this Department and Name already exists." in response.content

    response = web_lena.post(
        "/adapters/new/", {"department": "legal", "name": "Bad Name!", "base_model": ""}
    )
    assert response.status_code == 400
    assert b"Enter a valid" in response.content
    assert b"This field is required." in response.content


def test_unknown_owners_are_named(web_lena, lena):
    response = web_lena.post(
        "/adapters/new/",
        {"department": "legal", "name": "x", "base_model": "m", "owners": "lena, ghost"},
    )
    # The API answers 404 owner_not_found; on the form it is the field's error.
    assert response.status_code == 400
    assert b"Unknown owners: ghost." in response.content


def test_only_my_departments_are_offered(web_fred, legal):
    page = web_fred.get("/adapters/new/").content.decode()
    assert '<option value="finance"' in page
    assert 'value="legal"' not in page
    response = web_fred.post(
        "/adapters/new/", {"department": "legal", "name": "x", "base_model": "m"}
    )
    assert response.status_code == 400
    assert not Adapter.objects.exists()
