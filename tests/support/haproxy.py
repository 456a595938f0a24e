"""Start and stop a REAL HAProxy (Debian's haproxy 2.6) for a front door.

Pure Python, no Django: used by the gateway tests and bench/swap_through_gateway.py.

    door = HAProxyFrontDoor(tmp_path / "gw", listen=f"127.0.0.1:{free_port()}")
    door.write(table)                       # what it reads when it starts
    with running_haproxy(door, log=tmp_path / "haproxy.log", access=open_access()):
        ...                                 # door.apply(...), requests to the listen address

A door is closed until it is given an access table (no key known: every request
a 401); tests about routing, not access, pass an open one.

Its stdout (one line per request: backend, server, status) goes to `log`.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serving.door.callers import DoorAccess
from serving.door.haproxy import HAProxyFrontDoor
from tests.support.process_start import wait_until_started


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def haproxy_available() -> bool:
    return shutil.which("haproxy") is not None


def haproxy_runs() -> bool:
    """Whether the front door's tests run: without haproxy they skip, unless
    REQUIRE_HAPROXY (set by scripts/test.sh once it has installed haproxy, and
    in CI) makes that a failure."""
    return haproxy_available() or os.environ.get("REQUIRE_HAPROXY") == "1"


needs_haproxy = pytest.mark.skipif(
    not haproxy_runs(),
    reason="haproxy is not installed (scripts/test.sh installs Debian's haproxy)",
)


def peer_sessions(runtime) -> int:
    """A door's peers sessions established with other doors (`show peers`)."""
    return runtime.command("show peers").count("state=EST")


def wait_held(check: Callable[[], bool], describe: Callable[[], object], *, seconds: float = 3.0,
              timeout: float = 60.0) -> None:  # fmt: skip
    """Until `check` has held for `seconds` in a row. Doors' peers sessions,
    seen here: all established at once after a start, then dropped (both ends
    had connected at once) and established again 3-5 s later."""
    deadline, since = time.monotonic() + timeout, None
    while True:
        now = time.monotonic()
        if check():
            since = since or now
            if now - since >= seconds:
                return
        else:
            since = None
        assert now < deadline, describe()
        time.sleep(0.1)


def raw_request(
    address: str, method: str, path: str, body: bytes = b"", key: str = ""
) -> tuple[int, bytes]:
    """A request with its path byte for byte as given (requests and urllib
    normalise dot segments and unquote `%5F` before sending): (status, body)."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        if key:
            connection.putheader("Authorization", f"Bearer {key}")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def open_access(deployment: str = "gw", models: tuple[str, ...] = ()) -> DoorAccess:
    """A door that takes requests without keys (`models`: what /v1/models lists)."""
    return DoorAccess(deployment=deployment, open=True, allowed=frozenset(("*", m) for m in models))


@contextlib.contextmanager
def running_haproxy(
    door: HAProxyFrontDoor, *, log: Path, access: DoorAccess | None = None
) -> Iterator[subprocess.Popen]:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            door.command_line(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A child inherits the signals its parent blocks (a Celery worker in the
            # test process blocks some); HAProxy's master reloads on a signal.
            preexec_fn=_unblock_signals,
        )
    try:
        wait_until_started(process, door.runtime.available, what="haproxy", log=log)
        if access is not None:
            door.apply_access(access)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# The log-format of serving/door/haproxy/: client, frontend, backend, server,
# status, total time, retries, model.
_LINE = re.compile(
    r"^\S+ \S+ (?P<backend>\S+) (?P<server>\S+) (?P<status>-?\d+) \S+ (?P<retries>\+?\d+) "
)


def requests_by_server(log: Path) -> Counter:
    """(backend, server, status) -> requests, from HAProxy's log."""
    counts: Counter = Counter()
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match:
            counts[(match["backend"], match["server"], int(match["status"]))] += 1
    return counts


def retried_requests(log: Path) -> int:
    """Requests HAProxy sent again to another replica (a refused connection or a 404)."""
    total = 0
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match and match["retries"].lstrip("+") != "0":
            total += 1
    return total


def vllm_404s(log_path: Path, since: int = 0) -> int:
    """Completions a real vLLM answered 404 (it did not know the model), counted
    from its access log from byte `since` on."""
    with open(log_path, "rb") as handle:
        handle.seek(since)
        text = handle.read().decode(errors="replace")
    return len(re.findall(r'"POST /v1/(?:chat/)?completions HTTP/1\.1" 404', text))


def held_ms(log: Path, model: str, since: int = 0) -> list[int]:
    """How long the door held each request for `model` that it held (the last
    field of its log line, door.lua's txn.held_ms), from byte `since` on."""
    with open(log, "rb") as handle:
        handle.seek(since)
        text = handle.read().decode(errors="replace")
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) > 10 and words[7] == model and words[-1].isdigit():
            found.append(int(words[-1]))
    return found
