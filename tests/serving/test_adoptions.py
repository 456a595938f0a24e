"""Adopting what is already served (serving/services/adoptions.py): a stray on the
replicas becomes a managed version through the normal ingest and four-eyes, and is
then served where it is, with no load call at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from core.models import AuditEvent
from registry.models import AdapterVersion
from serving.models import Adoption, ServedAdapter
from serving.services.reconcile import reconcile_deployment
from tests.conftest import client_for
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


def _brownfield(deployment, replicas, spec: AdapterSpec, folder: Path, name="legal-brownfield"):
    """What a team had before the product: files on the volume, loaded by hand."""
    folder.mkdir(parents=True)
    for file_name, content in spec.files().items():
        (folder / file_name).write_bytes(content)
    for replica in replicas:
        loaded = requests.post(
            f"{replica.base_url}/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(folder)},
            timeout=10,
        )
        assert loaded.status_code == 200, loaded.text
    reconcile_deployment(deployment.pk, "test")  # observes the stray, leaves it loaded


@pytest.fixture
def as_root(root):
    return client_for(root)


@pytest.fixture
def as_alex(alex):
    return client_for(alex)


def test_a_stray_is_adopted_through_ingest_and_four_eyes_then_served_without_a_reload(
    deployment, fake_replicas, as_root, as_alex, legal
):
    folder = Path(deployment.volume_write_path) / "brownfield" / "contracts-v7"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=7), folder)
    strays = as_root.get(f"/api/v1/deployments/{deployment.name}/strays/").json()
    assert strays == [{"served_name": "legal-brownfield", "roots": [str(folder)],
                       "replicas": sorted(r.base_url for r in fake_replicas)}]  # fmt: skip
    loads_before = [r.calls.get("load", 0) for r in fake_replicas]

    response = as_root.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": "legal-brownfield", "department": "legal", "adapter": "brownfield"},
        format="json",
    )
    assert response.status_code == 201, response.content
    adoption = response.json()
    assert adoption["status"] == "pending_approval"
    version = AdapterVersion.objects.get(pk=adoption["version"])
    assert version.status == "pending_review" and version.adapter.served_name == "legal-brownfield"
    assert not ServedAdapter.objects.filter(adapter=version.adapter).exists()

    # Four-eyes: the admin who adopted cannot approve it; an approver of Legal can.
    assert as_root.post(f"/api/v1/versions/{version.pk}/approve/").status_code == 403
    assert as_alex.post(f"/api/v1/versions/{version.pk}/approve/", {"comment": "ours"},
                        format="json").status_code == 200  # fmt: skip

    assert Adoption.objects.get(pk=adoption["id"]).status == "served"
    served = ServedAdapter.objects.get(deployment=deployment, adapter=version.adapter)
    assert served.version_id == version.pk and served.served_path == str(folder)
    report = reconcile_deployment(deployment.pk, "test")
    assert report.repairs == [] and report.in_sync == 1  # the one adapter, everywhere
    assert [r.calls.get("load", 0) for r in fake_replicas] == loads_before  # no reload
    assert all("legal-brownfield" in r.adapters for r in fake_replicas)
    assert list(
        AuditEvent.objects.filter(action__startswith="adoption.")
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["adoption.requested", "adoption.served"]


def test_a_stray_served_from_outside_the_allowed_folders_is_not_read(
    deployment, fake_replicas, as_root, legal, tmp_path
):
    outside = tmp_path / "elsewhere" / "adapter"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=8), outside)
    response = as_root.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": "legal-brownfield", "department": "legal", "adapter": "brownfield"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "stray_not_readable"
    assert not AdapterVersion.objects.exists() and not Adoption.objects.exists()


def test_a_bad_artifact_is_refused_like_any_upload(deployment, fake_replicas, as_root, legal):
    folder = Path(deployment.volume_write_path) / "brownfield" / "broken"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=9), folder)
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": "eight"}')
    response = as_root.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": "legal-brownfield", "department": "legal", "adapter": "brownfield"},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert not AdapterVersion.objects.exists() and not Adoption.objects.exists()


def test_only_platform_admins_see_and_adopt_strays(deployment, fake_replicas, as_alex):
    assert as_alex.get(f"/api/v1/deployments/{deployment.name}/strays/").status_code in (403, 404)
    response = as_alex.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": "x", "department": "legal", "adapter": "x"},
        format="json",
    )
    assert response.status_code in (403, 404)
