"""The real-vLLM tier: two real vLLM servers (CPU, tiny generated model), the
session's shared ones (tests/support/vllm_pool.py: `vllm_servers`, or
`vllm_server` for a test that needs no second), a real Celery worker on the
configured broker for each test, and the people of tests/conftest.py driving
the REST API.

The worker runs in this process (threads), so tests that use it are
`django_db(transaction=True)`: its threads have their own database
connections and only see committed rows.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connections
from rest_framework.test import APIClient

from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe
from tests.support.adapters import AdapterSpec, adapter_tar_gz
from tests.support.vllm_pool import SERVED_BASE, runtime_adapters
from tests.support.vllm_servers import VLLMServer, ensure_tiny_model, ensure_vllm_installed
from tests.support.workers import purge_queues

MAX_LORA_RANK = 16
TERMINAL = {"succeeded", "failed", "rolled_back"}
# Generous: two vLLM servers, the worker and pytest share two slow cores.
ROLLOUT_TIMEOUT = 120.0


# -- real servers ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    ensure_vllm_installed()
    return ensure_tiny_model()


@pytest.fixture
def vllm_servers(vllm_pool) -> list[VLLMServer]:
    """Two replicas, the session's shared servers (tests/support/vllm_pool.py):
    both up and without runtime adapters when the test starts (a test before
    may have stopped one or left adapters loaded)."""
    return vllm_pool.servers(2)


@pytest.fixture
def vllm_server(vllm_pool) -> VLLMServer:
    """One replica, for a test that needs no second: the first shared server,
    up and without runtime adapters."""
    return vllm_pool.servers(1)[0]


def adapters_on(server: VLLMServer) -> dict[str, str | None]:
    """{served name: root} of the runtime adapters a real server lists now."""
    return runtime_adapters(server)


@pytest.fixture(autouse=True)
def fast_retries(settings):
    """Replaces tests/serving's one-second deadline: real servers are slower."""
    settings.SERVING_RETRY_DEADLINE_SECONDS = 30.0
    settings.SERVING_RETRY_BASE_SECONDS = 0.2
    settings.SERVING_RETRY_MAX_DELAY_SECONDS = 2.0
    settings.SERVING_HTTP_TIMEOUT_SECONDS = 60.0


# -- Celery worker on the configured broker --------------------------------------


@pytest.fixture
def worker_threads() -> int:
    """The worker's threads; a module overrides it (hundreds of rollouts keep
    two replicas busier with more at once)."""
    return 2


@pytest.fixture
def celery_worker(transactional_db, worker_threads) -> Iterator[Any]:
    """A real worker (thread pool) consuming every queue of the configured
    broker: the embedded SQLite one by default, Redis in CI."""
    from config.celery import app

    purge_queues(app)
    with start_worker(
        app,
        pool="threads",
        concurrency=worker_threads,
        perform_ping_check=False,
        shutdown_timeout=60,
        loglevel="WARNING",
    ) as worker:
        try:
            yield worker
        finally:
            # A test that failed mid-burst leaves rollouts queued and running:
            # stopping the worker then timed out with its threads still in the
            # database, and the flush after the test failed (so did the next test).
            settle_worker(app)
    purge_queues(app)
    connections.close_all()


def settle_worker(app, timeout: float = 120.0) -> None:
    """No task left running: queued messages purged, unfinished rollouts
    cancelled (a task holding one sees the cancel within seconds and stops, one
    not yet started returns at once), then waits until the worker is idle."""
    from celery.worker import state

    from serving.models import Rollout, RolloutStatus
    from serving.rules.transitions import ROLLOUT_TERMINAL

    purge_queues(app)
    # A direct UPDATE, not rollout_cancel: this is the test's clean-up, with no
    # person acting and nothing to audit; the rows are flushed right after.
    Rollout.objects.exclude(status__in=ROLLOUT_TERMINAL).update(status=RolloutStatus.CANCELLED)
    deadline = time.monotonic() + timeout
    while (state.active_requests or state.reserved_requests) and time.monotonic() < deadline:
        time.sleep(0.2)


# -- the people, through the REST API ------------------------------------------------


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def ok(response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.content[:2000])
    return response.json() if response.content else None


@dataclass
class Platform:
    """The registry and control plane as its users drive them over HTTP."""

    admin: APIClient
    member: APIClient
    approver: APIClient
    volume: Path
    tiny_model: Path
    _adapters: dict[str, int] = field(default_factory=dict)

    def create_deployment(
        self, name: str, replica_urls: list[str], *, open_door: bool = False, **extra
    ) -> dict:
        """`open_door`: its front door takes requests without keys (tests about
        routing; keys at the door: test_door_real.py)."""
        body = {
            "name": name,
            "environment": "staging",
            "base_model_name": SERVED_BASE,
            "base_model_path": str(self.tiny_model),
            "replica_urls": replica_urls,
            "volume_write_path": str(self.volume),
            "volume_serve_path": str(self.volume),
            "max_loras": 2,
            "max_cpu_loras": 4,
            "max_lora_rank": MAX_LORA_RANK,
            **extra,
        }
        created = ok(self.admin.post("/api/v1/deployments/", body, format="json"), 201)
        if open_door:
            from serving.models import Deployment

            Deployment.objects.filter(name=name).update(open_door=True)
        return created

    def adapter(self, name: str, served_name: str) -> int:
        if name not in self._adapters:
            body = {
                "department": "legal",
                "name": name,
                "base_model": SERVED_BASE,
                "served_name": served_name,
            }
            created = ok(self.member.post("/api/v1/adapters/", body, format="json"), 201)
            self._adapters[name] = created["id"]
        return self._adapters[name]

    def approved_version(self, adapter_name: str, served_name: str, spec: AdapterSpec) -> dict:
        """Lena uploads a real PEFT archive and submits it; Alex approves."""
        adapter_id = self.adapter(adapter_name, served_name)
        upload = _upload(spec)
        version = ok(
            self.member.post(
                f"/api/v1/adapters/{adapter_id}/versions/", {"files": [upload]}, format="multipart"
            ),
            201,
        )
        url = f"/api/v1/versions/{version['id']}"
        assert ok(self.member.post(f"{url}/submit/"))["status"] == "pending_review"
        approved = ok(self.approver.post(f"{url}/approve/", {"comment": "ok"}, format="json"))
        assert approved["status"] == "approved"
        return approved

    def promote(self, deployment: str, version_id: int, **extra):
        body = {"deployment": deployment, "version": version_id, **extra}
        return self.member.post("/api/v1/promotions/", body, format="json")

    def rollout(self, rollout_id: int) -> dict:
        # As the platform sees it: a member gets replica-N labels and folder names
        # (tests/serving/api/test_rollout_privacy.py), these tests compare real
        # paths and URLs.
        return ok(self.admin.get(f"/api/v1/rollouts/{rollout_id}/"))

    def wait_rollout(self, rollout_id: int, timeout: float = ROLLOUT_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            body = self.rollout(rollout_id)
            if body["status"] in TERMINAL:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"rollout {rollout_id} still {body['status']}: {body}")
            time.sleep(0.25)

    def promote_and_wait(self, deployment: str, version_id: int, **extra) -> dict:
        promotion = ok(self.promote(deployment, version_id, **extra), 201)
        assert promotion["status"] == "approved"
        return self.wait_rollout(promotion["rollout"])


def _upload(spec: AdapterSpec):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(
        "adapter.tar.gz", adapter_tar_gz(spec), content_type="application/gzip"
    )


@pytest.fixture
def platform(root, lena, alex, tiny_model, tmp_path) -> Platform:
    return Platform(
        admin=api_for(root),
        member=api_for(lena),
        approver=api_for(alex),
        volume=tmp_path / "volume",
        tiny_model=tiny_model,
    )


# -- helpers for the tests ------------------------------------------------------------


def chat_through_openai(base_url: str, model: str) -> str:
    """One chat completion as an application would send it: the openai client."""
    from openai import OpenAI

    api = OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    response = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=2, temperature=0
    )
    assert response.model == model
    return response.choices[0].message.content or ""


def probe(server: VLLMServer, model: str) -> Probe:
    """The greedy log-probabilities of `model` on a real server (serving.rules.probe)."""
    # Generous: the first completion after boot warms the engine up, on shared cores.
    with server.client(timeout=240) as client:
        answer = client.probe(model, prompt=PROBE_PROMPT, max_tokens=PROBE_TOKENS)
    assert answer.ok, answer.error
    result = Probe.from_body(answer.body)
    assert result is not None, answer.body
    return result


def wait_until(condition, timeout: float, interval: float = 0.25, message: str = "") -> float:
    """Polls `condition()` until truthy; returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true after {timeout:.0f}s: {message}")
        time.sleep(interval)
    return time.monotonic() - started


@contextlib.contextmanager
def in_background(target, *args) -> Iterator[threading.Thread]:
    """Runs `target(*args)` in a thread; re-raises its exception on exit."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(timeout=600)
    if errors:
        raise errors[0]
