"""The probe behind weight verification, on real vLLM: greedy logprobs repeat
exactly, a trained adapter moves them, an untrained one (every lora_B zero)
does not, and two replicas serving the same files agree (within the default
SERVING_FINGERPRINT_TOLERANCE) while a replica with other weights under the
same name does not; the reconcile finds such a replica and reloads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from safetensors.numpy import save as save_safetensors

from serving.models import DriftEvent, VersionFingerprint
from serving.reconcile.tick import reconcile_deployment
from serving.rollouts.engine import rollout_execute
from serving.rules.probe import Probe, has_no_effect, matches
from serving.services.promotions import promotion_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.serving.conftest import make_deployment
from tests.support.adapters import AdapterSpec, write_adapter_dir

from .conftest import SERVED_BASE, probe

pytestmark = pytest.mark.vllm


def load(server, name: str, path) -> None:
    with server.client(timeout=60) as client:
        answer = client.load_adapter(name, str(path))
    assert answer.ok, answer.error


def write_untrained(path, spec: AdapterSpec):
    """PEFT's initial state: random lora_A, zero lora_B (no effect at all)."""
    tensors = {
        name: (np.zeros_like(value) if ".lora_B." in name else value)
        for name, value in spec.tensors().items()
    }
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps(spec.config()))
    (path / "adapter_model.safetensors").write_bytes(save_safetensors(tensors))
    return path


def test_the_base_models_greedy_logprobs_repeat_exactly(vllm_servers):
    first, second = probe(vllm_servers[0], SERVED_BASE), probe(vllm_servers[0], SERVED_BASE)
    assert first.distance(second) == 0.0


def test_a_trained_adapter_moves_the_output_and_an_untrained_one_does_not(vllm_servers, tmp_path):
    server = vllm_servers[0]
    load(
        server, "trained", write_adapter_dir(tmp_path / "trained", AdapterSpec(seed=1, scale=0.05))
    )
    load(server, "untrained", write_untrained(tmp_path / "untrained", AdapterSpec(seed=1)))
    base = probe(server, SERVED_BASE)

    assert not has_no_effect(probe(server, "trained"), base)
    assert has_no_effect(probe(server, "untrained"), base)


def test_replicas_with_the_same_files_agree_and_other_weights_do_not(vllm_servers, tmp_path):
    right = write_adapter_dir(tmp_path / "right", AdapterSpec(seed=2, scale=0.05))
    wrong = write_adapter_dir(tmp_path / "wrong", AdapterSpec(seed=3, scale=0.05))
    load(vllm_servers[0], "contracts", right)
    load(vllm_servers[1], "contracts", right)
    fingerprint = probe(vllm_servers[0], "contracts")
    tolerance = settings.SERVING_FINGERPRINT_TOLERANCE

    assert matches(fingerprint, probe(vllm_servers[1], "contracts"), tolerance)

    with vllm_servers[1].client(timeout=60) as client:
        client.unload_adapter("contracts")
    load(vllm_servers[1], "contracts", wrong)
    assert not matches(fingerprint, probe(vllm_servers[1], "contracts"), tolerance)


@pytest.mark.django_db
def test_the_reconcile_finds_a_replica_with_other_weights_and_reloads_it(
    vllm_servers, root, lena, alex, legal, tmp_path
):
    urls = sorted(server.base_url for server in vllm_servers)
    deployment = make_deployment(root, urls, tmp_path / "volume", name="real-fingerprint")
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=2, scale=0.05))
    promotion = promotion_create(actor=actor(lena), deployment=deployment, version=version)
    rollout = promotion.rollouts.get()
    assert rollout_execute(rollout.pk, "w") == "succeeded"
    rollout.refresh_from_db()
    fingerprint = Probe.from_dict(VersionFingerprint.objects.get(version=version).probe)
    by_url = {server.base_url: server for server in vllm_servers}
    first, second = by_url[urls[0]], by_url[urls[1]]
    assert probe(second, "legal-contracts") == fingerprint

    # The second replica reloads the name from the right path while other bytes
    # are there (a volume that lagged behind, files replaced and put back): its
    # listing is right, its weights are not.
    folder = Path(rollout.served_path)
    aside = folder.with_name(folder.name + ".aside")
    os.rename(folder, aside)
    write_adapter_dir(folder, AdapterSpec(seed=3, scale=0.05))
    with second.client(timeout=60) as client:
        assert client.unload_adapter("legal-contracts").ok
    load(second, "legal-contracts", folder)
    for item in folder.iterdir():
        item.unlink()
    folder.rmdir()
    os.rename(aside, folder)
    stale = probe(second, "legal-contracts")
    assert not matches(fingerprint, stale, settings.SERVING_FINGERPRINT_TOLERANCE)
    print(f"\n[fingerprint] distance of the stale replica: {fingerprint.distance(stale)}")

    report = reconcile_deployment(deployment.pk, "beat")

    event = DriftEvent.objects.get(kind="fingerprint_mismatch")
    assert event.replica.base_url == second.base_url
    assert "it matches now" in event.detail, event.detail
    assert report.repairs == [f"{second.base_url}: fingerprint_mismatch legal-contracts"]
    assert probe(second, "legal-contracts") == fingerprint == probe(first, "legal-contracts")
    reconcile_deployment(deployment.pk, "beat")
    assert DriftEvent.objects.count() == 1
