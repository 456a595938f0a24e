"""A real MLflow tracking server on loopback, from its own virtualenv.

`mlflow server` runs with a SQLite backend and proxied artifact storage
(`--serve-artifacts`): clients upload and download through the server as
`mlflow-artifacts:/`, as in a usual deployment. The server can be stopped and
started again on the SAME port, so tests can stage an outage.

    server = MlflowServer.from_repo(workdir)
    server.start(); ...; server.stop(); server.start(); server.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.process_start import NotStarted, wait_until_started
from tests.support.s3_server import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-mlflow"

# A proxy from the environment must never sit between a client and loopback.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def mlflow_venv() -> Path:
    return Path(os.environ.get("MLFLOW_VENV", DEFAULT_VENV))


def server_installed(venv: Path | None = None) -> bool:
    venv = venv or mlflow_venv()
    return (venv / ".mlflow-installed").is_file() and (venv / "bin" / "mlflow").is_file()


class MlflowServer:
    def __init__(self, venv: Path, workdir: Path, port: int | None = None, env: dict | None = None):
        self.venv = venv
        self.extra_env = dict(env or {})
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.last_start_seconds = 0.0

    @classmethod
    def from_repo(cls, workdir: Path, env: dict | None = None) -> MlflowServer:
        return cls(mlflow_venv(), workdir, env=env)

    def command(self) -> list[str]:
        return [
            str(self.venv / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.workdir / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.workdir / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            # One worker: a 2-core machine, and a quicker start.
            "--workers",
            "1",
        ]

    def start(self, cpu_seconds: float = 120) -> None:
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        # The job runner (huey consumers for GenAI evaluation jobs) is not needed
        # here and roughly doubles start-up time on a small machine.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        # Webhook deliveries to the registry under test on loopback (MLflow refuses
        # private addresses by default, as it should in production).
        env["MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"] = "true"
        env["MLFLOW_WEBHOOK_ALLOWED_SCHEMES"] = "https,http"
        # MLflow caches which webhooks an event has for 60 s: a webhook a test creates
        # after earlier tests' events would stay unseen for that long.
        env["MLFLOW_WEBHOOK_CACHE_TTL"] = "1"
        env.update(self.extra_env)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            # Its own session: stop() ends the whole tree (mlflow → uvicorn → workers).
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            wait_until_started(
                self.proc,
                self._healthy,
                what="mlflow server",
                log=self.log_path,
                cpu_seconds=cpu_seconds,
                poll_seconds=0.2,
            )
        except NotStarted:
            self.stop()
            raise
        self.last_start_seconds = time.monotonic() - started

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _healthy(self) -> bool:
        try:
            with _NO_PROXY.open(self.url + "/health", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Workers may outlive the parent for a moment; wait until the port is free.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._wait_port_closed()
        self.proc = None

    def _wait_port_closed(self, timeout: float = 15) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.1)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
