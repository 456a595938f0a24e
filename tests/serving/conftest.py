"""Serving fixtures: fake vLLM replicas for unit tests of error paths, a
deployment for the tiny base model, and approved versions to promote."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest

from serving.services.deployments import deployment_create
from tests.conftest import actor
from tests.factories import make_adapter, make_approved_version
from tests.support.adapters import TINY_HIDDEN, TINY_INTERMEDIATE, TINY_LAYERS, AdapterSpec
from tests.support.vllm_standin import serve_standin

TINY_IDENTITY = {
    "architecture": "LlamaForCausalLM",
    "hidden_size": TINY_HIDDEN,
    "intermediate_size": TINY_INTERMEDIATE,
    "num_layers": TINY_LAYERS,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}


@pytest.fixture(autouse=True)
def fast_retries(settings):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 1.0
    settings.SERVING_RETRY_BASE_SECONDS = 0.05
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 0.2


@pytest.fixture
def fake_replicas():
    replicas = [serve_standin(), serve_standin()]
    yield replicas
    for replica in replicas:
        replica.close()


def make_deployment(admin, replica_urls, volume, name="staging-cpu", **extra):
    values = {
        "name": name,
        "environment": "staging",
        "base_model_name": "tiny-llama",
        "replica_urls": replica_urls,
        "volume_write_path": str(volume),
        "volume_serve_path": str(volume),
        "max_loras": 2,
        "max_cpu_loras": 4,
        "max_lora_rank": 16,
        **TINY_IDENTITY,
        **extra,
    }
    return deployment_create(actor=actor(admin), **values)


@pytest.fixture
def deployment(root, fake_replicas, tmp_path):
    return make_deployment(root, [r.base_url for r in fake_replicas], tmp_path / "volume")


@pytest.fixture
def contracts(lena, legal):
    return make_adapter(lena, legal, name="contracts", served_name="legal-contracts")


@pytest.fixture
def approved_v1(lena, alex, contracts):
    return make_approved_version(lena, alex, contracts, AdapterSpec(seed=1))


@pytest.fixture
def approved_v2(lena, alex, contracts, approved_v1):
    return make_approved_version(lena, alex, contracts, AdapterSpec(seed=2))


@pytest.fixture
def door_syncs(django_capture_on_commit_callbacks):
    """`with door_syncs() as sent:` the deployment ids whose front-door access
    sync was enqueued, once the block's transactions committed."""

    @contextmanager
    def capture():
        sent: list[int] = []
        with (
            mock.patch("serving.tasks.door_access_sync.delay", side_effect=sent.append),
            django_capture_on_commit_callbacks(execute=True),
        ):
            yield sent

    return capture
