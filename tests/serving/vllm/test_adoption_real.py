"""Adoption on real vLLM (serving/services/adoptions.py): an adapter someone loaded
on a replica by hand, from the deployment's adapter volume, becomes a managed
version through the API and four-eyes, and the replica never loads it again.

"Never loads it again" is counted twice: the control plane's own record of its
calls (HttpAttempt) and vLLM's log, which has a line for every adapter it loads
or removes, whoever asked. The answer is compared token by token, with its
log-probabilities, before and after: the same weights give the same numbers."""

from __future__ import annotations

import pytest

from registry.models import AdapterVersion
from serving.models import (
    Adoption,
    Deployment,
    DriftEvent,
    HttpAttempt,
    ServedAdapter,
    VersionFingerprint,
)
from serving.probe import Probe, has_no_effect
from serving.services.reconcile import reconcile_deployment
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


def test_a_stray_on_real_vllm_is_adopted_and_keeps_serving_without_a_reload(
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
    write_adapter_dir(
        platform.volume / "brownfield" / "contracts-v7", AdapterSpec(seed=7, scale=0.05)
    )
    folder = serve_path / "brownfield" / "contracts-v7"  # where vLLM reads them
    with server.client(timeout=60) as client:
        loaded = client.load_adapter(STRAY, str(folder))
    assert loaded.ok, loaded.error
    assert adapters_on(server) == {STRAY: str(folder)}
    answer_before, probe_before = _ask(server)
    assert not has_no_effect(probe_before, probe(server, SERVED_BASE))  # it is its own weights
    assert _vllm_log_lines(server) == (1, 0)  # our one load, no removal

    # 2. The reconcile sees a stray and leaves it loaded; the admin lists it.
    report = reconcile_deployment(deployment.pk, "test")
    assert report.replicas_up == 1 and report.repairs == [], report
    stray_events = DriftEvent.objects.filter(deployment=deployment, adapter_name=STRAY)
    assert list(stray_events.values_list("kind", "actual_root")) == [
        ("unknown_reported", str(folder))
    ]
    strays = ok(platform.admin.get("/api/v1/deployments/staging-cpu/strays/"))
    assert strays == [{"served_name": STRAY, "roots": [str(folder)], "replicas": [server.base_url]}]

    # 3. The admin adopts it into Legal; Alex, an approver of Legal, approves.
    adoption = ok(
        platform.admin.post(
            "/api/v1/deployments/staging-cpu/adopt/",
            {"served_name": STRAY, "department": "legal", "adapter": "brownfield"},
            format="json",
        ),
        201,
    )
    assert adoption["status"] == "pending_approval"
    version = AdapterVersion.objects.get(pk=adoption["version"])
    assert version.status == "pending_review"
    approve = f"/api/v1/versions/{version.pk}/approve/"
    assert platform.admin.post(approve).status_code == 403  # four-eyes: not the adopter
    assert ok(platform.approver.post(approve, {"comment": "ours"}, format="json"))["status"] == (
        "approved"
    )

    # 4. Served where it was, untouched by the product.
    assert Adoption.objects.get(pk=adoption["id"]).status == "served"
    served = ServedAdapter.objects.get(deployment=deployment, adapter=version.adapter)
    assert (served.version_id, served.served_path) == (version.pk, str(folder))
    assert ok(platform.admin.get("/api/v1/deployments/staging-cpu/strays/")) == []
    seen_drift = set(DriftEvent.objects.values_list("id", "count"))

    # The next tick probes it once, as any served version without a fingerprint
    # (a promotion records it when it verifies): the weights vLLM already had.
    report = reconcile_deployment(deployment.pk, "test")
    assert report.replicas_up == 1 and report.repairs == [], report
    fingerprint = Probe.from_dict(VersionFingerprint.objects.get(version=version).probe)
    assert fingerprint.distance(probe_before) == 0.0
    # And the one after finds nothing to do: in sync, no call stored.
    report = reconcile_deployment(deployment.pk, "test")
    assert report.replicas_up == 1 and report.repairs == [], report
    assert report.in_sync == 1 and not report.attempts_written, report

    assert set(DriftEvent.objects.values_list("id", "count")) == seen_drift  # no drift at all
    state = ok(platform.member.get("/api/v1/deployments/staging-cpu/state/"))
    assert [(d["served_name"], d["version"]) for d in state["desired"]] == [(STRAY, 1)]
    assert [a["in_sync"] for a in state["replicas"][0]["adapters"]] == [True], state
    assert adapters_on(server) == {STRAY: str(folder)}
    attempts = HttpAttempt.objects.filter(replica__deployment=deployment)
    calls = list(attempts.values_list("purpose", flat=True))
    print(f"\n[adopt] calls stored for the replica: {calls}")
    assert not {"load", "unload"} & set(calls), calls  # the product never (re)loaded it
    assert _vllm_log_lines(server) == (1, 0)  # nor did anyone else
    answer_after, probe_after = _ask(server)
    assert answer_after == answer_before
    assert probe_after.distance(probe_before) == 0.0


def _ask(server) -> tuple[str, Probe]:
    """What an application gets from the stray, and its greedy log-probabilities."""
    return chat_through_openai(server.base_url, STRAY), probe(server, STRAY)


def _vllm_log_lines(server) -> tuple[int, int]:
    """(loads, removals) of the stray in vLLM's own log, whoever asked for them."""
    log = server.log_path.read_text(errors="replace")
    return (
        log.count(f"Loaded new LoRA adapter: name '{STRAY}'"),
        log.count(f"Removed LoRA adapter: name '{STRAY}'"),
    )
