"""Adopting what is already served (serving/services/adoptions.py): a stray on the
replicas becomes a managed version through the normal ingest and four-eyes, then
is promoted like any version (the deployment's departments and promotion approval
apply) and served from the registry's copy of the reviewed files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import requests

from core.models import AuditEvent
from registry.models import AdapterVersion
from serving.models import Adoption, Promotion, Rollout, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.volume import serve_path_for
from tests.conftest import client_for
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db
STRAY = "legal-brownfield"


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


def _adopt(as_root, deployment) -> dict:
    response = as_root.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": STRAY, "department": "legal", "adapter": "brownfield"},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def _approve(as_alex, version) -> None:
    response = as_alex.post(
        f"/api/v1/versions/{version.pk}/approve/", {"comment": "ours"}, format="json"
    )
    assert response.status_code == 200, response.content


def test_an_adopted_stray_is_served_from_the_reviewed_copy_whatever_its_folder_becomes(
    deployment, fake_replicas, as_root, as_alex, legal
):
    folder = Path(deployment.volume_write_path) / "brownfield" / "contracts-v7"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=7), folder)
    strays = as_root.get(f"/api/v1/deployments/{deployment.name}/strays/").json()
    assert strays == [{"served_name": STRAY, "roots": [str(folder)],
                       "replicas": sorted(r.base_url for r in fake_replicas)}]  # fmt: skip

    adoption = _adopt(as_root, deployment)
    assert adoption["status"] == "pending_approval"
    version = AdapterVersion.objects.get(pk=adoption["version"])
    assert version.status == "pending_review" and version.adapter.served_name == STRAY
    assert not ServedAdapter.objects.filter(adapter=version.adapter).exists()

    # Four-eyes: the admin who adopted cannot approve it; an approver of Legal can.
    assert as_root.post(f"/api/v1/versions/{version.pk}/approve/").status_code == 403
    _approve(as_alex, version)

    # Approved: promoted like any version, as the admin who asked.
    assert Adoption.objects.get(pk=adoption["id"]).status == "served"
    promotion = Promotion.objects.get(deployment=deployment, version=version)
    assert (promotion.status, promotion.requested_by.username) == ("approved", "root")
    rollout = Rollout.objects.get(deployment=deployment, target_version=version)
    assert rollout_execute(rollout.pk, "w1") == "succeeded"

    # Served from the version's folder, staged from the registry's store and
    # checked against the digests ingested at adoption; never the stray's folder.
    copy = serve_path_for(deployment, version)
    served = ServedAdapter.objects.get(deployment=deployment, adapter=version.adapter)
    assert (served.version_id, served.served_path) == (version.pk, copy)
    assert copy != str(folder)
    for item in version.files:
        data = (Path(copy) / item["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == item["sha256"]
    assert [r.adapters[STRAY] for r in fake_replicas] == [copy, copy]
    reviewed = [r.weights[STRAY] for r in fake_replicas]

    # Someone with the volume changes the stray's folder; the replicas restart
    # (vLLM keeps nothing) and the reconcile loads the adapter again: the
    # reviewed weights, from the copy.
    for file_name, content in AdapterSpec(seed=99).files().items():
        (folder / file_name).write_bytes(content)
    for replica in fake_replicas:
        replica.restart()
    report = reconcile_deployment(deployment.pk, "test")
    assert report.replicas_up == 2, report
    assert [r.adapters[STRAY] for r in fake_replicas] == [copy, copy]
    assert [r.weights[STRAY] for r in fake_replicas] == reviewed
    assert list(
        AuditEvent.objects.filter(action__startswith="adoption.")
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["adoption.requested", "adoption.served"]


def test_an_adoption_waits_for_the_deployments_promotion_approval(
    root, fake_replicas, as_root, as_alex, legal, tmp_path
):
    deployment = make_deployment(
        root,
        [r.base_url for r in fake_replicas],
        tmp_path / "volume",
        requires_promotion_approval=True,
    )
    folder = Path(deployment.volume_write_path) / "brownfield" / "contracts-v7"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=7), folder)
    version = AdapterVersion.objects.get(pk=_adopt(as_root, deployment)["version"])
    _approve(as_alex, version)

    promotion = Promotion.objects.get(deployment=deployment, version=version)
    assert promotion.status == "pending_approval"
    assert not Rollout.objects.filter(deployment=deployment).exists()
    assert [r.adapters[STRAY] for r in fake_replicas] == [str(folder)] * 2  # still a stray
    # Four-eyes on the promotion too: the adopter asked for it, so not the adopter.
    refused = as_root.post(f"/api/v1/promotions/{promotion.pk}/approve/")
    assert refused.status_code == 403, refused.content
    approved = as_alex.post(f"/api/v1/promotions/{promotion.pk}/approve/")
    assert approved.status_code == 200, approved.content
    rollout = Rollout.objects.get(deployment=deployment, target_version=version)
    assert rollout_execute(rollout.pk, "w1") == "succeeded"
    copy = serve_path_for(deployment, version)
    assert [r.adapters[STRAY] for r in fake_replicas] == [copy, copy]


def test_a_department_the_deployment_does_not_accept_cannot_adopt(
    deployment, fake_replicas, as_root, legal, finance
):
    deployment.allowed_departments.set([finance])
    folder = Path(deployment.volume_write_path) / "brownfield" / "contracts-v7"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=7), folder)
    response = as_root.post(
        f"/api/v1/deployments/{deployment.name}/adopt/",
        {"served_name": STRAY, "department": "legal", "adapter": "brownfield"},
        format="json",
    )
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "department_not_allowed"
    assert not AdapterVersion.objects.exists() and not Adoption.objects.exists()


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


def test_a_deployment_that_stops_accepting_the_department_before_approval_refuses_it(
    deployment, fake_replicas, as_root, as_alex, legal, finance
):
    """Checked again when the version is approved: the version stays approved,
    the adoption ends refused (audited with the reason), the stray stays a stray."""
    folder = Path(deployment.volume_write_path) / "brownfield" / "contracts-v7"
    _brownfield(deployment, fake_replicas, AdapterSpec(seed=7), folder)
    adoption = _adopt(as_root, deployment)
    deployment.allowed_departments.set([finance])
    version = AdapterVersion.objects.get(pk=adoption["version"])
    _approve(as_alex, version)

    version.refresh_from_db()
    assert version.status == "approved"
    assert Adoption.objects.get(pk=adoption["id"]).status == "rejected"
    assert not Promotion.objects.filter(version=version).exists()
    assert not Rollout.objects.filter(target_version=version).exists()
    event = AuditEvent.objects.filter(action="adoption.rejected").get()
    assert "does not accept adapters from legal" in event.details["refused"]
    assert [r.adapters[STRAY] for r in fake_replicas] == [str(folder)] * 2
