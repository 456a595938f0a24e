"""Replica addresses and volume paths are the platform's: a department sees
its rollouts through labels (replica-1, ...) and folder names, on the API and
the rollout page, including inside vLLM's and the HTTP client's error texts."""

from __future__ import annotations

import pytest

from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor, client_for
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db

# Nothing listens on the discard port: every call to it fails and names it.
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture
def rollout(root, lena, fake_replicas, approved_v1, tmp_path):
    urls = [r.base_url for r in fake_replicas] + [UNREACHABLE]
    deployment = make_deployment(root, urls, tmp_path / "volume", require_all_replicas=True)
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout = promotion.rollouts.get()
    rollout_execute(rollout.pk, "w")
    rollout.refresh_from_db()
    return rollout


def _secrets(fake_replicas, tmp_path) -> list[str]:
    hosts = [r.base_url.rstrip("/") for r in fake_replicas] + [UNREACHABLE, "127.0.0.1:9"]
    return [*hosts, str(tmp_path / "volume")]


def test_members_see_labels_not_addresses_on_the_api(rollout, lena, fake_replicas, tmp_path):
    member = client_for(lena)
    detail = member.get(f"/api/v1/rollouts/{rollout.pk}/")
    listing = member.get("/api/v1/rollouts/")

    for response in (detail, listing):
        assert response.status_code == 200
        text = response.content.decode()
        for secret in _secrets(fake_replicas, tmp_path):
            assert secret not in text, f"{secret} shown to a member"
    replicas = detail.json()["replicas"]
    assert sorted(r["base_url"] for r in replicas) == ["replica-1", "replica-2", "replica-3"]
    assert any(r["error"] for r in replicas), "the unreachable replica's error is still told"
    assert all(a["url"].startswith("replica-") for r in replicas for a in r["attempts"])


def test_admins_see_the_addresses(rollout, root, fake_replicas):
    body = client_for(root).get(f"/api/v1/rollouts/{rollout.pk}/").content.decode()
    assert UNREACHABLE in body
    assert all(r.base_url.rstrip("/") in body for r in fake_replicas)


def test_the_rollout_page_shows_members_labels(rollout, lena, root, fake_replicas, tmp_path):
    member = client_for(lena)
    for url in (
        f"/rollouts/{rollout.pk}/",
        f"/rollouts/{rollout.pk}/live/",
    ):
        response = member.get(url)
        assert response.status_code == 200, url
        text = response.content.decode()
        for secret in _secrets(fake_replicas, tmp_path):
            assert secret not in text, f"{secret} shown to a member on {url}"
        assert "replica-3" in text
    assert UNREACHABLE in client_for(root).get(f"/rollouts/{rollout.pk}/").content.decode()
