"""Adoption on real vLLM (serving/services/adoptions.py): an adapter someone loaded
on a replica by hand, from the deployment's adapter volume, becomes a managed
version through the API and four-eyes, is promoted, and is then served from the
registry's copy of the reviewed files: overwriting the folder it was found in
and restarting the replica changes nothing clients get.

Answers are compared token by token, with their log-probabilities: the same
weights give the same numbers, other weights do not (checked here too)."""

from __future__ import annotations

import pytest

from registry.models import AdapterVersion
from serving.models import Adoption, Deployment, Promotion, Rollout, ServedAdapter
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.rules.probe import Probe, has_no_effect
from serving.volume import serve_path_for
from tests.serving.vllm.conftest import (
    SERVED_BASE,
    adapters_on,
    chat_through_openai,
    ok,
    probe,
)
from tests.support.adapters import AdapterSpec, write_adapter_dir

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

STRAY = "legal-brownfield"


def test_an_adopted_stray_on_real_vllm_serves_the_reviewed_weights_whatever_its_folder_becomes(
    platform, vllm_server, legal, tmp_path
):
    server = vllm_server
    # As on a cluster, the replicas mount the adapter volume elsewhere than the
    # control plane does: vLLM reads it at serve_path, the product at the volume.
    platform.volume.mkdir()
    serve_path = tmp_path / "serve-mount"
    serve_path.symlink_to(platform.volume)
    platform.create_deployment("staging-cpu", [server.base_url], volume_serve_path=str(serve_path))
    deployment = Deployment.objects.get(name="staging-cpu")

    # 1. Behind the product's back: files on the volume, loaded by hand.
    found = platform.volume / "brownfield" / "contracts-v7"
    write_adapter_dir(found, AdapterSpec(seed=7, scale=0.05))
    folder = serve_path / "brownfield" / "contracts-v7"  # where vLLM reads them
    with server.client(timeout=60) as client:
        loaded = client.load_adapter(STRAY, str(folder))
    assert loaded.ok, loaded.error
    answer_before, probe_before = _ask(server)
    assert not has_no_effect(probe_before, probe(server, SERVED_BASE))  # its own weights

    # 2. The reconcile leaves the stray loaded; the admin adopts it into Legal and
    # Alex, an approver of Legal, approves it (not the admin: four eyes).
    reconcile_deployment(deployment.pk, "test")
    adoption = ok(
        platform.admin.post(
            "/api/v1/deployments/staging-cpu/adopt/",
            {"served_name": STRAY, "department": "legal", "adapter": "brownfield"},
            format="json",
        ),
        201,
    )
    version = AdapterVersion.objects.get(pk=adoption["version"])
    approve = f"/api/v1/versions/{version.pk}/approve/"
    assert platform.admin.post(approve).status_code == 403
    ok(platform.approver.post(approve, {"comment": "ours"}, format="json"))

    # 3. Promoted like any version: the rollout stages the registry's copy and
    # swaps the replica to it, verified.
    assert Adoption.objects.get(pk=adoption["id"]).status == "served"
    assert Promotion.objects.get(deployment=deployment, version=version).status == "approved"
    rollout = Rollout.objects.get(deployment=deployment, target_version=version)
    assert rollout_execute(rollout.pk, "test") == "succeeded"
    copy = serve_path_for(deployment, version)
    served = ServedAdapter.objects.get(deployment=deployment, adapter=version.adapter)
    assert (served.version_id, served.served_path) == (version.pk, copy)
    assert adapters_on(server) == {STRAY: copy}
    assert _ask(server)[1].distance(probe_before) == 0.0  # the same weights

    # 4. Someone with the volume overwrites the stray's folder; vLLM restarts
    # (it keeps nothing) and the reconcile loads the adapter again.
    write_adapter_dir(found, AdapterSpec(seed=99, scale=0.05))
    server.restart()
    report = reconcile_deployment(deployment.pk, "test")
    assert report.replicas_up == 1, report
    assert adapters_on(server) == {STRAY: copy}
    answer_after, probe_after = _ask(server)
    print(f"\n[adopt] served from {copy}; before {answer_before!r}, after {answer_after!r}")
    assert probe_after.distance(probe_before) == 0.0
    assert answer_after == answer_before
    # The overwritten folder would have answered otherwise: the check can fail.
    with server.client(timeout=60) as client:
        assert client.load_adapter("tampered", str(folder)).ok
    assert probe(server, "tampered").distance(probe_before) > 0


def _ask(server) -> tuple[str, Probe]:
    """What an application gets from the stray, and its greedy log-probabilities."""
    return chat_through_openai(server.base_url, STRAY), probe(server, STRAY)
