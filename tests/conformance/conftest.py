"""The conformance tier: cases made by real PEFT, verdicts from real vLLM, and the
product driven over its REST API with a real Celery worker.

Cases are generated once per session (and cached across runs); one vLLM server
per architecture serves both the ground truth and the product's rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conformance import cases as generated_cases
from tests.conformance import matrix
from tests.serving.vllm.conftest import celery_worker  # noqa: F401 - a fixture
from tests.support.vllm_servers import VLLMServer

RESULTS: dict[str, list[dict]] = {}


@pytest.fixture(scope="session")
def generated():
    started = time.monotonic()
    models, cases = generated_cases.generate(matrix.cases())
    print(f"\n[conformance] {len(cases)} cases ready in {time.monotonic() - started:.1f}s")
    return models, cases


@pytest.fixture
def fast_retries(settings):
    settings.SERVING_RETRY_DEADLINE_SECONDS = 30.0
    settings.SERVING_RETRY_BASE_SECONDS = 0.2
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 2.0
    settings.SERVING_HTTP_TIMEOUT_SECONDS = 60.0


def start_server(architecture: str, model_dir, cases: int, log_dir) -> VLLMServer:
    # Host cache sized for every case of the architecture: none is evicted
    # mid-comparison, so a verdict never depends on a re-read from disk.
    server = VLLMServer(
        name=f"conformance-{architecture}",
        model_dir=model_dir,
        served_name=f"conformance/{architecture}",
        max_loras=2,
        max_cpu_loras=max(2, cases),
        max_lora_rank=16,
        log_dir=log_dir,
    )
    server.start()
    server.wait_ready(timeout=400)
    return server


@pytest.fixture
def server_for(tmp_path_factory) -> Iterator:
    started: list[VLLMServer] = []

    def start(architecture: str, model_dir, cases: int) -> VLLMServer:
        server = start_server(
            architecture, model_dir, cases, tmp_path_factory.mktemp("conformance-logs")
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
