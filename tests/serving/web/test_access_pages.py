"""Who may call what, on the pages: the open-door warning on a deployment's page."""

from __future__ import annotations

import pytest

from serving.services.deployments import deployment_update
from tests.conftest import actor
from tests.serving.conftest import make_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def staging(root, tmp_path):
    return make_deployment(root, ["http://127.0.0.1:9/"], tmp_path / "volume")


def test_a_deployment_page_warns_while_its_front_door_is_open(staging, root, web_lena):
    page = web_lena.get(f"/deployments/{staging.name}/").content.decode()
    assert 'data-testid="open-door"' not in page
    assert "an inference key for every request" in page

    deployment_update(actor=actor(root), deployment=staging, open_door=True)

    page = web_lena.get(f"/deployments/{staging.name}/").content.decode()
    assert 'data-testid="open-door"' in page
    assert "open: no key needed" in page
