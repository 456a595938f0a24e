"""A client that aborts every stream is counted all the same, on REAL vLLM 0.32:
vLLM exports no span for a request the client aborted, so the spans alone miss
it; the reconcile's reading of the replica's own counters (/metrics) against
the spans (observability.unmetered) charges what no span reported to the
deployment's unattributed tokens. Every token vLLM counted is then charged to
someone: the callers' spans plus the unattributed rest."""

from __future__ import annotations

import json
import time

import pytest
import requests
from django.db.models import Sum

from observability import unmetered
from observability.models import MeteredRequest, UnattributedTokens
from observability.otlp import metering_token
from serving.models import Replica
from serving.replica_calls import metrics_read
from tests.serving.conftest import make_deployment
from tests.serving.vllm.test_metering_real import vllm_totals
from tests.support.vllm_pool import SERVED_BASE
from tests.support.vllm_servers import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

DEPLOYMENT = "aborting-cpu"


def stream(url: str, *, abort: bool) -> None:
    """One streamed chat completion; aborted after its first chunk, or read to its end."""
    body = {
        "model": SERVED_BASE,
        "messages": [{"role": "user", "content": "Write a long clause about liability"}],
        "max_tokens": 200,
        "ignore_eos": True,  # vLLM's: generate all 200, so the abort comes first
        "stream": True,
    }
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: {") and abort:
                json.loads(line[6:])
                break  # closing the connection aborts the request in vLLM


def tick(deployment, server: VLLMServer) -> tuple[int, int]:
    replicas = list(Replica.objects.filter(deployment=deployment))
    with requests.Session() as session:
        reading = metrics_read(server.base_url, api_key=None, session=session)
    assert reading.snapshot is not None, reading.outcome.error
    return unmetered.unmetered_tokens_reconcile(deployment, replicas, {replicas[0].pk: reading})


def wait_quiet(server: VLLMServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with requests.Session() as session:
            snapshot = metrics_read(server.base_url, api_key=None, session=session).snapshot
        if snapshot is not None and snapshot.requests_in_flight == 0:
            return
        assert time.monotonic() < deadline, "vLLM still has requests in flight"
        time.sleep(0.2)


def test_a_client_that_aborts_every_stream_cannot_escape_being_counted(
    live_server, root, tiny_model, tmp_path, monkeypatch
):
    server = VLLMServer(
        name="aborting",
        model_dir=tiny_model,
        log_dir=tmp_path,
        served_name=SERVED_BASE,
        env={
            "SERVE_OTLP_TRACES_ENDPOINT": f"{live_server.url}/otlp/{DEPLOYMENT}/v1/traces",
            "SERVE_OTLP_TOKEN": metering_token(DEPLOYMENT),
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
    deployment = make_deployment(root, [server.base_url], tmp_path / "volume", name=DEPLOYMENT)
    Replica.objects.get_or_create(deployment=deployment, base_url=server.base_url)
    server.start_and_wait(300)
    try:
        wait_quiet(server)
        tick(deployment, server)  # nothing in flight: the baseline
        before = vllm_totals(server)
        stream(server.base_url, abort=False)  # a client that reads to the end: a span
        for _ in range(6):
            stream(server.base_url, abort=True)
        wait_quiet(server)
        time.sleep(2)  # the exporter's batch (200 ms) and the receiver
        after = vllm_totals(server)
        counted = (after[0] - before[0], after[1] - before[1])
        spans = MeteredRequest.objects.filter(deployment=deployment).aggregate(
            p=Sum("prompt_tokens"), c=Sum("completion_tokens")
        )
        # vLLM sent a span for the finished request and none for the aborted ones.
        assert MeteredRequest.objects.filter(deployment=deployment).count() == 1
        assert spans["c"] == 200

        # Settled at once here (in production, SETTLE_AFTER_SECONDS later).
        monkeypatch.setattr(unmetered, "SETTLE_AFTER_SECONDS", 0)
        monkeypatch.setattr(unmetered, "SAMPLE_EVERY_SECONDS", 0)
        charged = tick(deployment, server)
    finally:
        server.stop()

    row = UnattributedTokens.objects.get(deployment=deployment)
    assert charged == (row.prompt_tokens, row.completion_tokens)
    # Every token vLLM counted is charged: the span's to its caller, the rest here.
    assert (spans["p"] + row.prompt_tokens, spans["c"] + row.completion_tokens) == counted
    assert row.prompt_tokens > 0 and row.completion_tokens >= 6  # each abort generated some
    assert row.completion_tokens < 6 * 200  # and was stopped before its end
