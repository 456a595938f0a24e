"""Observability tests run on the serving fixtures (fake replicas, the tiny
deployment, approved versions) and the web tier's signed-in clients."""

from __future__ import annotations

import pytest

from tests.serving.conftest import (  # noqa: F401 - fixtures
    approved_v1,
    approved_v2,
    contracts,
    deployment,
    fake_replicas,
    fast_retries,
)
from tests.support.pages import signed_in


def read_before(served_on, at: float) -> None:
    """As if every replica's /metrics had been read once before, up to vLLM's
    stamp `at` (a first read is only a baseline), and the rollouts' own probes
    long since settled (serving.records.own_probes): what a test then serves
    is clients' news."""
    from django.utils import timezone

    from observability.models import ReplicaLoraState
    from serving.models import OwnProbe

    OwnProbe.objects.filter(replica__deployment=served_on).delete()
    for replica in served_on.replicas.all():
        ReplicaLoraState.objects.update_or_create(
            replica=replica,
            defaults={"observed_at": timezone.now(), "ok_reads": 1, "series_timestamp": at},
        )


@pytest.fixture
def web_lena(lena):
    return signed_in(lena)


@pytest.fixture
def web_fred(fred):
    return signed_in(fred)


def lora_info(*series: tuple[str, str, float], max_lora: int = 2) -> str:
    """A /metrics body as vLLM 0.32 writes it: one series per (running, waiting, time)."""
    lines = [
        "# HELP vllm:lora_requests_info Running stats on lora requests.",
        "# TYPE vllm:lora_requests_info gauge",
    ]
    for running, waiting, at in series:
        lines.append(
            f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} {at}'
        )
    return "\n".join(lines) + "\n"
