"""Reading vLLM's /metrics as hostile input (a real HTTP server that
misbehaves), and telling the control plane's own probes from clients in the
label sets (parsed in serving.lora_metrics: tests/serving/test_lora_metrics.py)."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from observability.vllm_metrics import clients_only, fetch_metrics
from serving.lora_metrics import LoraSeries, parse_lora_metrics
from serving.probe import OwnRequests
from tests.support.metrics_samples import VLLM_032


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


def test_label_sets_of_the_control_planes_own_probes_are_left_out_and_clients_kept():
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


def test_label_sets_of_marked_probes_are_left_out_until_their_deadline():
    # legal probed by a rollout (marked: its probes current until 100.0).
    marked = {"legal": 100.0}
    probe = LoraSeries(running=("legal",), waiting=("legal",), timestamp=99.5)
    later = LoraSeries(running=("legal",), waiting=(), timestamp=100.5)  # a client, after
    mixed = LoraSeries(running=("legal", "finance"), waiting=(), timestamp=99.6)
    other = LoraSeries(running=("finance",), waiting=(), timestamp=99.7)
    series = (probe, later, mixed, other)

    assert clients_only(series, None, after=90.0, marked=marked) == (later, mixed, other)
    # With the tick's own probes of finance too, the mixed set is all probes'.
    own = OwnRequests(frozenset({"finance"}), before={})
    assert clients_only(series, own, after=90.0, marked=marked) == (later,)
    assert clients_only(series, None, after=90.0) == series
