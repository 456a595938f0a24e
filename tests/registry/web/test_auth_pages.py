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


# --- sign-in throttling (django-axes) -------------------------------------------------


@pytest.fixture
def three_strikes(settings):
    settings.AXES_FAILURE_LIMIT = 3


def test_the_nth_failed_sign_in_locks_the_username_out(three_strikes, client, lena):
    from django.test import Client

    for _ in range(2):
        assert client.post("/login/", {"username": "lena", "password": "nope"}).status_code == 200
    third = client.post("/login/", {"username": "lena", "password": "nope"})
    assert third.status_code == 429

    # Locked out: even the right password, even from another address.
    elsewhere = Client(REMOTE_ADDR="10.1.2.3")
    right = elsewhere.post("/login/", {"username": "lena", "password": PASSWORD})
    assert right.status_code == 429
    assert elsewhere.get("/").status_code == 302  # not signed in


def test_failures_from_one_address_lock_that_address_out(three_strikes, client, lena, alex):
    from django.test import Client

    for name in ("nobody", "someone", "anyone"):
        client.post("/login/", {"username": name, "password": "nope"})
    assert client.post("/login/", {"username": "alex", "password": PASSWORD}).status_code == 429
    # Alex from another address is not affected.
    other = Client(REMOTE_ADDR="10.9.9.9")
    assert other.post("/login/", {"username": "alex", "password": PASSWORD}).status_code == 302


def test_a_success_before_the_limit_resets_the_count(three_strikes, client, lena):
    for _ in range(2):
        client.post("/login/", {"username": "lena", "password": "nope"})
    assert client.post("/login/", {"username": "lena", "password": PASSWORD}).status_code == 302
    client.post("/logout/")
    for _ in range(2):
        assert client.post("/login/", {"username": "lena", "password": "nope"}).status_code == 200
