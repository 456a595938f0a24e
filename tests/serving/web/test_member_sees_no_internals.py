"""Members see their department's adapters, never the platform's internals: a
walk through every page a member can reach, following each link, fails on any
server path, storage URI or volume hint it finds. Admins may see them (the
same walk, as an admin, finds them: the test can fail)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from django.conf import settings

from serving.models import DriftEvent, ServedAdapter
from serving.rollouts.engine import rollout_execute
from serving.services.promotions import promotion_create
from tests.conftest import actor

pytestmark = pytest.mark.django_db

# Pages that are not the member's UI: leaving, the admin (staff only), the API and its docs.
SKIP = re.compile(r"^/(logout|admin|api|api-auth|oidc|scim|metrics|static)/?")
MAX_PAGES = 150


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href and "download" not in dict(attrs):
                self.hrefs.append(href)


def walk(client, start: str = "/") -> dict[str, str]:
    """Every same-site page reachable from `start` by links: {path: html}."""
    seen: dict[str, str] = {}
    queue = [start]
    while queue and len(seen) < MAX_PAGES:
        path = queue.pop(0)
        if path in seen:
            continue
        response = client.get(path)
        assert response.status_code in (200, 302, 404), (path, response.status_code)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            seen[path] = ""
            continue
        html = response.content.decode()
        seen[path] = html
        parser = Links()
        parser.feed(html)
        for href in parser.hrefs:
            target = urlsplit(urljoin(path, href))
            if target.netloc or not target.path.startswith("/") or SKIP.match(target.path):
                continue
            queue.append(target.path + (f"?{target.query}" if target.query else ""))
    return seen


def internals(tmp_path, deployment) -> list[str]:
    return [
        str(tmp_path),
        str(settings.BASE_DIR),
        str(settings.VAR_DIR),
        deployment.volume_write_path,
        deployment.volume_serve_path,
        "file://",
        "s3://",
        "base_model_pvc",
        "PVC",
    ]


def leaks(pages: dict[str, str], needles: list[str]) -> list[str]:
    found = []
    for path, html in pages.items():
        for needle in needles:
            at = html.find(needle)
            if needle and at >= 0:
                found.append(f"{path}: {needle!r} in …{html[max(0, at - 80) : at + 80]}…")
    return found


@pytest.fixture
def platform(tmp_path, root, lena, alex, contracts, deployment, approved_v1, approved_v2):
    """A served adapter with a rollout behind it, a drift event naming roots, and
    a base model known by its path: what the pages would leak if they leaked."""
    deployment.base_model_aliases = [str(tmp_path / "models" / "tiny-llama")]
    deployment.save(update_fields=["base_model_aliases"])
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=approved_v1)
    rollout_execute(promotion.rollouts.get().pk, "w")
    served = ServedAdapter.objects.get(deployment=deployment, adapter=contracts)
    replica = deployment.replicas.first()
    replica.last_error = f"could not read {served.served_path}/adapter_config.json"
    replica.save(update_fields=["last_error"])
    DriftEvent.objects.create(
        deployment=deployment,
        replica=replica,
        kind="repair_failed",
        adapter_name=contracts.served_name,
        expected_root=served.served_path,
        actual_root=str(tmp_path / "elsewhere"),
        detail=f"FileNotFoundError: {served.served_path}/adapter_model.safetensors",
    )
    return deployment


def test_every_page_a_member_reaches_is_free_of_server_paths_and_storage_uris(
    web_lena, tmp_path, platform
):
    pages = walk(web_lena)
    assert len([p for p in pages if p.startswith("/versions/")]) >= 2  # it did walk
    assert any(p.startswith("/deployments/") for p in pages)
    assert any(p.startswith("/rollouts/") for p in pages)
    found = leaks(pages, internals(tmp_path, platform))
    assert not found, "\n".join(found)


def test_the_same_walk_as_an_admin_finds_them_so_it_can_fail(web_root, tmp_path, platform):
    pages = walk(web_root)
    assert leaks(pages, internals(tmp_path, platform))
