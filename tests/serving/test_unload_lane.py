"""Unloads that cannot take a vLLM 0.32 replica down: a reload waits for the old
load's requests to finish before loading the name again, and unloads on one
replica go one at a time (docs/upstream/vllm-unload-keyerror.md)."""

from __future__ import annotations

import threading
import time

import pytest

from serving import replica_calls
from serving.fact_readings import busy_adapters_from_metrics
from serving.replica_calls import (
    ReplicaOutcome,
    RetryPolicy,
    ensure_loaded,
    ensure_unloaded,
    reload_adapter,
)
from serving.vllm_client import AttemptResult, VLLMClient
from tests.support.adapters import write_adapter_dir
from tests.support.attempts import answered
from tests.support.vllm_standin import serve_standin

POLICY = RetryPolicy(deadline_seconds=0, base_delay=0, max_delay=0)


def _lora_info(series: list[tuple[str, float]]) -> str:
    lines = ["# TYPE vllm:lora_requests_info gauge"]
    for running, stamp in series:
        lines.append(
            f'vllm:lora_requests_info{{max_lora="2",running_lora_adapters="{running}",'
            f'waiting_lora_adapters=""}} {stamp}'
        )
    return "\n".join(lines) + "\n"


def _metrics(text: str) -> AttemptResult:
    return answered(text)


def test_the_newest_lora_series_says_which_adapters_are_busy():
    text = _lora_info([("legal,hr", 100.0), ("hr", 200.0), ("legal", 50.0)])
    assert busy_adapters_from_metrics(_metrics(text)) == {"hr"}


def test_no_lora_series_cannot_tell():
    assert busy_adapters_from_metrics(_metrics("# nothing here\n")) is None


@pytest.fixture
def folders(tmp_path):
    return {v: str(write_adapter_dir(tmp_path / v)) for v in ("v1", "v2")}


@pytest.fixture
def replica():
    server = serve_standin(version="0.32.0")
    yield server
    server.close()


def _client(replica) -> VLLMClient:
    return VLLMClient(replica.base_url, timeout=5)


def test_a_reload_does_not_load_while_the_old_loads_requests_run(replica, folders, settings):
    # The record lists the name and no newer one comes: an engine starved of
    # CPU, not an idle one, however long past ENGINE_IDLE_SECONDS (an idle
    # engine writes a record without the name). Only the deadline ends the wait.
    settings.SERVING_UNLOAD_SETTLE_SECONDS = 4 * replica_calls.ENGINE_IDLE_SECONDS
    with _client(replica) as client:
        assert ensure_loaded(client, "legal", folders["v1"], POLICY).ok
        replica.metrics_text = _lora_info([("legal", time.time())])
        started = time.monotonic()
        outcome = ensure_loaded(client, "legal", folders["v2"], POLICY, known_version="0.32.0")
    assert not outcome.ok
    assert "still running" in outcome.error and "SERVING_UNLOAD_SETTLE_SECONDS" in outcome.error
    assert time.monotonic() - started >= settings.SERVING_UNLOAD_SETTLE_SECONDS
    paths = [path for _, path, _ in replica.requests]
    unloaded_at = paths.index("/v1/unload_lora_adapter")
    assert "/v1/load_lora_adapter" not in paths[unloaded_at:]  # not loaded again
    assert "legal" not in replica.adapters
    assert [p for p, _ in outcome.attempts].count("unload_settle") >= 2


def test_a_reload_loads_once_the_name_is_idle(replica, folders, settings):
    settings.SERVING_UNLOAD_SETTLE_SECONDS = 10
    with _client(replica) as client:
        assert ensure_loaded(client, "legal", folders["v1"], POLICY).ok
        replica.metrics_text = _lora_info([("legal", 1.0)])

        def idle_soon():
            time.sleep(0.3)
            replica.metrics_text = _lora_info([("legal", 1.0), ("", 2.0)])

        threading.Thread(target=idle_soon).start()
        outcome = ensure_loaded(client, "legal", folders["v2"], POLICY, known_version="0.32.0")
    assert outcome.ok, outcome.error
    assert replica.adapters["legal"] == folders["v2"]


def test_a_name_requested_before_is_loaded_only_after_a_newer_record(replica, folders):
    # Unloaded outside the product: not listed, and the newest record shows it
    # idle. A request admitted just before that unload is not in the record yet.
    replica.metrics_text = _lora_info([("legal", 100.0), ("", 200.0)])
    with _client(replica) as client:
        started = time.monotonic()
        outcome = ensure_loaded(client, "legal", folders["v1"], POLICY, known_version="0.32.0")
    assert outcome.ok, outcome.error
    # The grace, then a newer record or ENGINE_IDLE_SECONDS without one.
    assert time.monotonic() - started >= 0.7
    assert [p for p, _ in outcome.attempts].count("unload_settle") >= 2
    assert replica.adapters["legal"] == folders["v1"]


def test_a_name_no_record_ever_listed_loads_at_once(replica, folders):
    replica.metrics_text = _lora_info([("hr", 100.0), ("", 200.0)])
    with _client(replica) as client:
        outcome = ensure_loaded(client, "legal", folders["v1"], POLICY, known_version="0.32.0")
    assert outcome.ok, outcome.error
    assert [p for p, _ in outcome.attempts] == ["unload_settle", "load"]


def test_a_loaded_name_requested_before_is_looked_up_once(replica, folders):
    with _client(replica) as client:
        assert ensure_loaded(client, "legal", folders["v1"], POLICY).ok
        replica.metrics_text = _lora_info([("legal", 100.0), ("", 200.0)])
        same = ensure_loaded(client, "legal", folders["v1"], POLICY, known_version="0.32.0")
        swap = ensure_loaded(client, "legal", folders["v2"], POLICY, known_version="0.32.0")
    assert same.ok and swap.ok, (same.error, swap.error)
    assert [p for p, _ in same.attempts] == ["unload_settle", "list_models"]
    purposes = [p for p, _ in swap.attempts]
    assert purposes.count("list_models") == 1 and "load" in purposes, purposes
    assert purposes.index("list_models") < purposes.index("unload") < purposes.index("load")
    assert replica.adapters["legal"] == folders["v2"]


class _SlowUnloads:
    """A client whose unloads take a while, noting how many overlap."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.at_once = 0
        self.most = 0
        self.lock = threading.Lock()

    def unload_adapter(self, name):
        with self.lock:
            self.at_once += 1
            self.most = max(self.most, self.at_once)
        time.sleep(0.05)
        with self.lock:
            self.at_once -= 1
        return answered("")

    def metrics(self):
        return _metrics(_lora_info([("", 1.0)]))

    def load_adapter(self, name, path):
        return answered("")


def test_unloads_on_one_replica_go_one_at_a_time_whoever_asks():
    client = _SlowUnloads("http://replica-one:8000")
    other = _SlowUnloads("http://replica-two:8000")
    calls = [
        lambda: ensure_unloaded(client, "a", POLICY),
        lambda: reload_adapter(client, "b", "/b", POLICY, ReplicaOutcome()),
        lambda: ensure_unloaded(client, "c", POLICY),
        lambda: ensure_unloaded(other, "a", POLICY),
        lambda: ensure_unloaded(other, "b", POLICY),
    ]
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.most == 1 and other.most == 1


def test_unloads_on_one_replica_are_paced(settings):
    settings.SERVING_UNLOAD_PACE_SECONDS = 0.2
    client = _SlowUnloads("http://replica-paced:8000")
    started = time.monotonic()
    for name in ("a", "b", "c"):
        assert ensure_unloaded(client, name, POLICY).ok
    assert time.monotonic() - started >= 0.4
