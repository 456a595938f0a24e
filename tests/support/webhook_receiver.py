"""A webhook receiver for tests: a real HTTP server on loopback whose answer a
test chooses, recording every request it gets.

    receiver = Receiver()                  # http://127.0.0.1:<port>/hooks/registry
    receiver.mode = "error"                # "ok", "error" (500), "gone" (410),
                                           # "hang" (no answer for 30 s), "flood"
                                           # (a 200 whose body never ends)
    receiver.delay = 1.0                   # each answer waits 1 s (a slow receiver)
    receiver.secret = secret               # check each signature as it arrives
    receiver.received                      # [(headers, body), ...] in arrival order

Used by tests/notifications (webhooks and chat channels, in the test's own
process) and by the fault tier (tests/faults/test_notifications_delivered.py,
where worker subprocesses deliver to it).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from notifications.signing import HEADER, verify


class Receiver:
    """A real HTTP server on loopback whose answer a test chooses: "ok",
    "error" (500), "gone" (410), "hang" (no answer for 30 s), "flood" (a
    200 whose body never ends). `delay` seconds pass before any answer, and
    `in_flight` counts the requests received and not yet answered. With
    `secret` set, each request's signature is checked as it arrives
    (notifications.signing.verify, as a pipeline would) and the requests
    whose signature fails are kept in `bad_signatures` too."""

    def __init__(self):
        self.mode = "ok"
        self.delay = 0.0
        self.secret: str | None = None
        self.received: list[tuple[dict, bytes]] = []
        self.bad_signatures: list[tuple[dict, bytes]] = []
        self.in_flight = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = dict(self.headers)
                with receiver._lock:
                    receiver.received.append((headers, body))
                    if receiver.secret is not None and not verify(
                        receiver.secret, body, headers.get(HEADER, "")
                    ):
                        receiver.bad_signatures.append((headers, body))
                    receiver.in_flight += 1
                try:
                    self._answer()
                except OSError:
                    pass  # the sender went away (killed, or cut off) before the answer
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1

            def _answer(self):
                if receiver.delay:
                    time.sleep(receiver.delay)
                if receiver.mode == "hang":
                    time.sleep(30)
                    return
                if receiver.mode == "flood":
                    self.send_response(200)
                    self.end_headers()
                    for _ in range(100_000):
                        self.wfile.write(b"x" * 1024)
                    return
                code = {"ok": 200, "error": 500, "gone": 410}[receiver.mode]
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"thanks" if code == 200 else b"receiver broke")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.path = "/hooks/registry"
        self.url = f"http://127.0.0.1:{self.port}{self.path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
