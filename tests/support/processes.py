"""Start, kill and restart the product's own processes and the servers it
talks to, from tests: a redis-server of the test's own, Celery workers and
beats as `make run` and production start them (real subprocesses sharing the
test's database), and a TCP proxy that can take a dependency off the network.

Pure Python, no Django: every process runs in its own process group, so a
kill reaches the prefork children too (as an OOM kill or a lost node would).

    redis = RedisServer().start()          # redis-server on a free port, no persistence
    redis.restart()                        # same port, empty: every queued message is gone
    worker = CeleryWorker(env, log_dir / "worker.log").start().wait_ready()
    worker.kill()                          # SIGKILL, whole group, no warm shutdown
    with TcpProxy("127.0.0.1", 9000) as s3:
        s3.go_down(); ...; s3.come_up()    # connection refused in between
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.vllm_servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


class ProcessError(RuntimeError):
    """A process failed to start or become ready (message includes its log tail)."""


def _log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


_live: set[_Group] = set()


@atexit.register
def _kill_leftovers() -> None:
    # A failing or interrupted test run must not leave workers consuming a queue.
    for group in list(_live):
        group.kill()


class _Group:
    """One subprocess in its own session (process group), logging to a file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self, command: list[str], env: Mapping[str, str] | None, cwd: Path) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%H:%M:%S")
            log.write(f"\n===== {' '.join(command[:3])} at {stamp} =====\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _signal(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def _group_alive(self) -> bool:
        if self.process is None:
            return False
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        # Zombies still count for killpg(0); reap the leader and look again.
        self.process.poll()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[2]) == self.process.pid and fields[0] != "Z":
                        return True
        return False

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_alive():
                return True
            time.sleep(0.05)
        return not self._group_alive()

    def kill(self) -> None:
        """SIGKILL to the whole group: no shutdown handler runs, nothing is acked."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._wait_gone(10)
        _live.discard(self)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (a warm shutdown for Celery), SIGKILL after `timeout`."""
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        if not self._wait_gone(timeout):
            self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._wait_gone(5)
        _live.discard(self)

    def log_tail(self, chars: int = 3000) -> str:
        return _log_tail(self.log_path, chars)


# -- redis-server ---------------------------------------------------------------


class RedisServer(_Group):
    """A redis-server of the caller's own on a fixed free port, nothing on disk:
    a restart loses every queued message, as a Redis without persistence does."""

    def __init__(self, log_dir: Path, port: int | None = None, binary: str = "redis-server"):
        super().__init__(log_dir / "redis.log")
        self.port = port or free_port()
        self.binary = binary
        self.log_dir = log_dir

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.log_dir),
        ]  # fmt: skip

    def start(self, timeout: float = 20) -> RedisServer:
        if self.is_running():
            return self
        self._spawn(self.command(), None, self.log_dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ProcessError(f"redis-server exited:\n{self.log_tail()}")
            if self.ping():
                return self
            time.sleep(0.05)
        raise ProcessError(f"redis-server not answering after {timeout}s:\n{self.log_tail()}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def restart(self) -> float:
        """Hard restart on the same port; returns the seconds Redis was away."""
        started = time.monotonic()
        self.kill()
        self.start()
        return time.monotonic() - started


# -- Celery -----------------------------------------------------------------------

# The worker consumes the project's default queue and every queue its routes
# name, so it does all the work a full `make run` would, whatever the routing.
_WORKER = """
import sys
import django
django.setup()
from config.celery import app
routes = app.conf.task_routes or {}
queues = {app.conf.task_default_queue} | {q.name for q in app.conf.task_queues or ()}
if isinstance(routes, dict):
    queues |= {r["queue"] for r in routes.values() if isinstance(r, dict) and r.get("queue")}
app.worker_main(["worker", "-Q", ",".join(sorted(queues)), "-n", sys.argv[1] + "@%h",
                 "--pool", sys.argv[2], "--concurrency", sys.argv[3], "--loglevel=INFO",
                 "--without-gossip", "--without-mingle"])
"""


class CeleryWorker(_Group):
    """A `celery worker` subprocess of the project's app on the broker and
    database named by `env` (DATABASE_URL, CELERY_BROKER_URL, ...)."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        name: str | None = None,
        pool: str = "prefork",
        concurrency: int = 2,
    ) -> None:
        super().__init__(log_path)
        self.env = dict(env)
        self.name = name or log_path.stem
        self.pool = pool
        self.concurrency = concurrency
        self._log_offset = 0

    def start(self) -> CeleryWorker:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [sys.executable, "-c", _WORKER, self.name, self.pool, str(self.concurrency)]
        self._spawn(command, self.env, REPO_ROOT)
        return self

    def wait_ready(self, timeout: float = 90) -> CeleryWorker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise ProcessError(f"worker exited with {code}:\n{self.log_tail()}")
            if " ready." in self.log_since_start():
                return self
            time.sleep(0.1)
        raise ProcessError(f"worker not ready after {timeout}s:\n{self.log_tail()}")

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""


class CeleryBeat(_Group):
    """`celery beat` with the project's schedule, its state file of its own."""

    def __init__(self, env: Mapping[str, str], log_path: Path, schedule_path: Path) -> None:
        super().__init__(log_path)
        self.env = dict(env)
        self.schedule_path = schedule_path

    def start(self) -> CeleryBeat:
        command = [
            sys.executable, "-m", "celery", "-A", "config", "beat",
            "--loglevel=INFO", "--schedule", str(self.schedule_path),
        ]  # fmt: skip
        self._spawn(command, self.env, REPO_ROOT)
        return self

    def wait_ready(self, timeout: float = 60) -> CeleryBeat:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise ProcessError(f"beat exited with {code}:\n{self.log_tail()}")
            if "beat: Starting" in self.log_tail(20000):
                return self
            time.sleep(0.1)
        raise ProcessError(f"beat not started after {timeout}s:\n{self.log_tail()}")


# -- a TCP proxy that can leave the network ------------------------------------------


class TcpProxy:
    """Forwards a loopback port to `upstream` byte for byte. `go_down()` closes
    the listener and cuts every open connection (clients see "connection
    refused", as when the server's host is gone); `come_up()` listens again
    on the SAME port, so clients configured with it carry on."""

    def __init__(self, upstream_host: str, upstream_port: int, port: int | None = None):
        self.upstream = (upstream_host, upstream_port)
        self.port = port or free_port()
        self.connections_seen = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.come_up()

    @classmethod
    def in_front_of(cls, base_url: str) -> TcpProxy:
        """A relay to the server at `base_url` (http://host:port)."""
        parts = urlsplit(base_url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 80)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def come_up(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def go_down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @contextlib.contextmanager
    def down(self):
        self.go_down()
        try:
            yield self
        finally:
            self.come_up()

    def close(self) -> None:
        self.go_down()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by go_down()
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections_seen += 1
                self._open |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        pairs = {client: upstream, upstream: client}
        try:
            for sock in pairs:
                sock.setblocking(True)
                selector.register(sock, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select(timeout=60):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    pairs[key.fileobj].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            with self._lock:
                for sock in pairs:
                    self._open.discard(sock)
                    sock.close()
