"""Reading vLLM's /metrics as hostile input (a real HTTP server that
misbehaves), and telling the control plane's own probes from clients in the
label sets (parsed in serving.lora_metrics: tests/serving/test_lora_metrics.py)."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from observability.vllm_metrics import clients_only
from serving.lora_metrics import LoraSeries, parse_lora_metrics
from serving.vllm_client import fetch_metrics
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
                        for _ in range(300):
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
    # The 1 s deadline, not the trickle's 30 s (room for the light run's stalls:
    # it is niced beside vLLM).
    assert time.monotonic() - started < 10.0


@pytest.mark.parametrize("hostile", ["error"], indirect=True)
def test_an_error_status_is_a_failed_attempt(hostile):
    attempt, text = fetch_metrics(hostile.url, api_key=None, timeout=5, max_bytes=1 << 20)
    assert text is None and attempt.status_code == 503 and attempt.transient


def test_a_refused_connection_is_a_transient_failure():
    attempt, text = fetch_metrics("http://127.0.0.1:9", api_key=None, timeout=2, max_bytes=1024)
    assert text is None and attempt.status_code is None and attempt.transient


def test_label_sets_of_marked_probes_are_left_out_until_their_deadline():
    # legal probed by a rollout or the tick's weight check (marked: its probes
    # current until 100.0).
    marked = {"legal": 100.0}
    probe = LoraSeries(running=("legal",), waiting=("legal",), timestamp=99.5)
    later = LoraSeries(running=("legal",), waiting=(), timestamp=100.5)  # a client, after
    mixed = LoraSeries(running=("legal", "finance"), waiting=(), timestamp=99.6)
    other = LoraSeries(running=("finance",), waiting=(), timestamp=99.7)
    idle = LoraSeries(running=(), waiting=(), timestamp=99.8)
    series = (probe, later, mixed, other, idle)

    assert clients_only(series, marked) == (later, mixed, other, idle)
    # finance probed too, until 99.65: the mixed set is all probes', finance's own is not.
    assert clients_only(series, {**marked, "finance": 99.65}) == (later, other, idle)
    assert clients_only(series, None) == series
