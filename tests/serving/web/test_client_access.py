""" "How clients reach this" on the deployment and adapter pages: the front
door's URL and a request to copy, with a placeholder for the caller's key."""

from __future__ import annotations

import pytest

from serving.models import ServedAdapter

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(deployment, contracts, approved_v1):
    return ServedAdapter.objects.create(
        deployment=deployment, adapter=contracts, version=approved_v1
    )


@pytest.fixture
def door(settings, deployment):
    settings.SERVING_DOORS = {deployment.name: "127.0.0.1:8200"}
    settings.SERVING_DOOR_URLS = {}


def _card(html: str, deployment) -> str:
    start = html.index(f'data-testid="client-access-{deployment.name}"')
    return html[start : html.index("</section>", start)]


def test_the_adapter_page_shows_the_door_and_a_request_for_this_adapter(
    web_lena, door, served, deployment, contracts
):
    card = _card(web_lena.get(f"/adapters/{contracts.pk}/").content.decode(), deployment)
    assert '<code data-testid="door-url">http://127.0.0.1:8200/v1</code>' in card
    assert "curl http://127.0.0.1:8200/v1/chat/completions" in card
    assert "Authorization: Bearer &lt;your key&gt;" in card
    assert f"&quot;model&quot;: &quot;{contracts.served_name}&quot;" in card
    assert 'data-copy="' in card


def test_the_deployment_page_uses_the_public_url_when_one_is_set(
    web_lena, settings, door, served, deployment, contracts
):
    settings.SERVING_DOOR_URLS = {deployment.name: "https://llm.example.com/"}
    card = _card(web_lena.get(f"/deployments/{deployment.name}/").content.decode(), deployment)
    assert "curl https://llm.example.com/v1/chat/completions" in card
    assert f"&quot;model&quot;: &quot;{contracts.served_name}&quot;" in card


def test_a_door_with_a_certificate_is_shown_as_https(web_lena, settings, door, served, deployment):
    settings.SERVING_DOOR_CERTIFICATES = {deployment.name: "/etc/door-tls/tls.pem"}
    card = _card(web_lena.get(f"/deployments/{deployment.name}/").content.decode(), deployment)
    assert '<code data-testid="door-url">https://127.0.0.1:8200/v1</code>' in card


def test_without_a_front_door_members_are_told_to_ask_not_shown_replicas(
    web_lena, served, deployment
):
    card = _card(web_lena.get(f"/deployments/{deployment.name}/").content.decode(), deployment)
    assert "has no front door yet" in card
    assert "Ask your platform team" in card
    assert "SERVING_DOORS" not in card
    assert "curl" not in card


def test_an_adapter_served_nowhere_has_no_card(web_lena, contracts, approved_v1, deployment):
    assert "How clients reach" not in web_lena.get(f"/adapters/{contracts.pk}/").content.decode()
