import pytest

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    response = client.get("/adapters/1/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/adapters/1/"


def test_it_signs_in_with_a_password_and_lands_on_the_dashboard(client, lena):
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'<label for="id_username"' in page.content

    response = client.post("/login/", {"username": "lena", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_says_so_when_the_password_is_wrong(client, lena):
    response = client.post("/login/", {"username": "lena", "password": "nope"})
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


def test_logout_is_a_post(web_lena):
    assert web_lena.get("/logout/").status_code == 405
    response = web_lena.post("/logout/")
    assert response.status_code == 302
    assert response["Location"] == "/login/"
    assert web_lena.get("/").status_code == 302


def test_posts_without_a_csrf_token_are_refused(lena, contracts, v1):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(lena)
    response = client.post(f"/versions/{v1.pk}/actions/", {"action": "submit"})
    assert response.status_code == 403
    v1.refresh_from_db()
    assert v1.status == "registered"


def test_pages_carry_a_csrf_token_for_htmx(web_lena):
    response = web_lena.get("/")
    assert b'hx-headers=\'{"X-CSRFToken": "' in response.content
    assert b"/static/vendor/htmx.min.js" in response.content
