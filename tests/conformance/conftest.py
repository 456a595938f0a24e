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
from tests.serving.vllm.conftest import celery_worker, worker_threads  # noqa: F401 - fixtures
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
    """Starts it; ServerPool.get waits until it is ready."""
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
    return server


@pytest.fixture(scope="session")
def server_pool(request, tmp_path_factory) -> Iterator[ServerPool]:
    # The architectures in the order this session runs them (pytest-randomly
    # may have shuffled them), so the next ones' servers boot ahead.
    order = [
        item.callspec.params["architecture"]
        for item in request.session.items
        if item.originalname == "test_the_product_agrees_with_vllm_and_peft"
        and hasattr(item, "callspec")
    ]
    pool = ServerPool(order, tmp_path_factory.mktemp("conformance-logs"))
    yield pool
    pool.stop_all()


class ServerPool:
    """One vLLM server per architecture, the next ones booting while this one's
    cases run. A boot is 47-86 s on the shared 2 cores, mostly the imports of
    two processes, and it was ~75% of a cached run (438 of 598 s), while an
    architecture's 8 cases take 15-25 s, most of it waiting on rollouts: so
    AHEAD servers boot ahead, at most AHEAD + 1 are alive at once (about 1 GB
    each), and each is stopped when its architecture is done. A server still
    only ever serves its own architecture's verdicts and rollouts."""

    AHEAD = 2

    def __init__(self, order: list[str], log_dir) -> None:
        self.order, self.log_dir = order, log_dir
        self.specs: dict[str, tuple] = {}  # architecture: (model folder, cases)
        self.servers: dict[str, VLLMServer] = {}

    def know(self, models: dict, cases: dict) -> None:
        for architecture, model_dir in models.items():
            count = sum(1 for c in cases.values() if c.case.architecture == architecture)
            self.specs[architecture] = (model_dir, count)

    def _start(self, architecture: str) -> VLLMServer:
        if architecture not in self.servers:
            model_dir, count = self.specs[architecture]
            self.servers[architecture] = start_server(architecture, model_dir, count, self.log_dir)
        return self.servers[architecture]

    def get(self, architecture: str) -> VLLMServer:
        server = self._start(architecture)
        if architecture in self.order:
            following = self.order[self.order.index(architecture) + 1 :]
            for ahead in following[: self.AHEAD]:
                if ahead in self.specs:
                    self._start(ahead)  # boots while this one's cases run
        started = time.monotonic()
        server.wait_ready(timeout=400)
        waited = time.monotonic() - started
        print(f"[conformance] {architecture}: waited {waited:.0f} s for its server")
        return server

    def done(self, architecture: str) -> None:
        server = self.servers.pop(architecture, None)
        if server is not None:
            server.stop()

    def stop_all(self) -> None:
        for architecture in list(self.servers):
            self.done(architecture)


@pytest.fixture
def server_for(server_pool, generated) -> Iterator:
    server_pool.know(*generated)
    used: list[str] = []

    def get(architecture: str) -> VLLMServer:
        used.append(architecture)
        return server_pool.get(architecture)

    yield get
    for architecture in used:
        server_pool.done(architecture)
