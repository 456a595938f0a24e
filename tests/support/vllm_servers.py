"""Start, stop and crash REAL vLLM servers (CPU, tiny model) from Python.

Pure Python, no Django: used by pytest fixtures, `make run` helpers and the
benchmarks. Each server is `scripts/vllm/serve.sh` in its own process group
(API server + EngineCore child); every server started here is killed at
interpreter exit, including after a failing test.

    ensure_vllm_installed()
    model = ensure_tiny_model()
    servers = start_servers(2, model_dir=model, log_dir=tmp_path)   # boot in parallel
    servers[0].base_url                # "http://127.0.0.1:<port>"
    with servers[1].down():            # replica down, back up (same port) after
        ...
    servers[0].kill()                  # simulated crash (SIGKILL, whole group)
    servers[0].restart()               # fresh process, no runtime adapters
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts" / "vllm"
INSTALL_SH = SCRIPTS / "install.sh"
SERVE_SH = SCRIPTS / "serve.sh"
MAKE_TINY_MODEL = SCRIPTS / "make_tiny_model.py"
DEFAULT_MODEL_DIR = REPO_ROOT / "var" / "models" / "tiny-llama"
DEFAULT_LOG_DIR = REPO_ROOT / "var" / "log" / "vllm"
DEFAULT_SERVED_NAME = "tiny-llama"
INSTALL_MARKER = ".vllm-installed"

# Runs serve.sh in the background of a bash whose stdin is a pipe from this
# Python process. The pipe only reaches EOF when we are gone (normal exit,
# crash, SIGKILL): the watchdog then SIGKILLs the whole process group, so no
# EngineCore is left orphaned. (PR_SET_PDEATHSIG would only cover the direct
# child: EngineCore survived a SIGKILLed pytest that way.)
_WATCHDOG = r"""
exec 3<&0 </dev/null
( read -r _ <&3; kill -KILL 0 ) &
watchdog=$!
exec 3<&-
"$@" &
server=$!
wait "$server"
rc=$?
kill "$watchdog" 2>/dev/null
exit "$rc"
"""

# Inherited variables that would change the server behind our back.
_SCRUBBED_ENV = ("VLLM_API_KEY", "VLLM_PORT", "VLLM_HOST_IP", "VLLM_VENV")


class VLLMServerError(RuntimeError):
    """A server failed to start or become ready (message includes log tail)."""


# -- installation ------------------------------------------------------------


def vllm_venv() -> Path:
    """The vLLM virtualenv: $VLLM_VENV or <repo>/.venv-vllm."""
    return Path(os.environ.get("VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"


def vllm_available() -> bool:
    """Cheap check (no import): the install script finished in this venv."""
    return vllm_python().is_file() and (vllm_venv() / INSTALL_MARKER).is_file()


def ensure_vllm_installed(timeout: float = 1800) -> Path:
    """Run scripts/vllm/install.sh unless already done; returns the python."""
    if not vllm_available():
        subprocess.run(
            ["bash", str(INSTALL_SH), str(vllm_venv())],
            check=True,
            timeout=timeout,
            cwd=REPO_ROOT,
        )
    return vllm_python()


def ensure_tiny_model(
    path: Path | str | None = None, *, name: str = DEFAULT_SERVED_NAME, seed: int = 0
) -> Path:
    """Generate the tiny Llama at `path` (default var/models/tiny-llama) if
    missing; a no-op (~0.1 s) when present with the same spec."""
    target = Path(path) if path else DEFAULT_MODEL_DIR
    python = ensure_vllm_installed()
    subprocess.run(
        [str(python), str(MAKE_TINY_MODEL), str(target), "--name", name, "--seed", str(seed)],
        check=True,
        timeout=600,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
    )
    return target.resolve()


# -- ports ---------------------------------------------------------------------

_port_lock = threading.Lock()
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now and that this process has not handed out."""
    with _port_lock:
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no free port found")


# -- cleanup -------------------------------------------------------------------

_live_lock = threading.Lock()
_live: dict[int, VLLMServer] = {}  # id(server) -> server, while a process may run
_atexit_installed = False


def _register(server: VLLMServer) -> None:
    global _atexit_installed
    with _live_lock:
        _live[id(server)] = server
        if not _atexit_installed:
            atexit.register(stop_all)
            _install_sigterm_handler()
            _atexit_installed = True


def _unregister(server: VLLMServer) -> None:
    with _live_lock:
        _live.pop(id(server), None)


def _install_sigterm_handler() -> None:
    # A SIGTERM to pytest would skip atexit; turn it into SystemExit, but only
    # if nobody else handles SIGTERM and only from the main thread.
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def stop_all(timeout: float = 15) -> None:
    """Stop every server this process started (SIGTERM, then SIGKILL)."""
    with _live_lock:
        servers = list(_live.values())
    for server in servers:
        server._signal_group(signal.SIGTERM)
        server._signal_group(signal.SIGCONT)
    deadline = time.monotonic() + timeout
    for server in servers:
        server._wait_gone(max(0.0, deadline - time.monotonic()))
        server._signal_group(signal.SIGKILL)
        server._reap()
        _unregister(server)


# -- server --------------------------------------------------------------------


def record_boot(name: str) -> None:
    """One line per real vLLM start in $SUITE_TIER_TIMES (make test sets it; the
    benches' subprocesses inherit it): a boot is about 30 s of one core here,
    so scripts/suite_clock.py prints how many a run cost."""
    path = os.environ.get("SUITE_TIER_TIMES")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"vllm_boot": name}) + "\n")


def _http_get(url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class VLLMServer:
    """One vLLM OpenAI server (scripts/vllm/serve.sh) on a fixed port.

    The port is chosen once (free_port) and kept across restart/down, so
    a registry entry for this replica stays valid.
    """

    def __init__(
        self,
        *,
        name: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        model_dir: Path | str | None = None,
        served_name: str = DEFAULT_SERVED_NAME,
        max_loras: int = 2,
        max_cpu_loras: int = 4,
        max_lora_rank: int = 16,
        api_key: str | None = None,
        threads: int = 1,
        cpu_bind: str = "nobind",
        kv_cache_bytes: int = 64 * 1024 * 1024,
        log_dir: Path | str | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.name = name or f"vllm-{self.port}"
        self.model_dir = Path(model_dir) if model_dir else DEFAULT_MODEL_DIR
        self.served_name = served_name
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self.api_key = api_key
        self.threads = threads
        self.cpu_bind = cpu_bind
        self.kv_cache_bytes = kv_cache_bytes
        self.log_dir = Path(log_dir) if log_dir else DEFAULT_LOG_DIR
        self.log_path = self.log_dir / f"{self.name}.log"
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.last_start_seconds: float | None = None  # start() -> ready
        self._started_at: float | None = None
        self._log_file: Any = None

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"VLLMServer({self.name!r}, {self.base_url}, {state})"

    # -- properties

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle

    def command(self) -> list[str]:
        cmd = [
            "bash",
            str(SERVE_SH),
            "--port", str(self.port),
            "--host", self.host,
            "--model", str(self.model_dir),
            "--name", self.served_name,
            "--max-loras", str(self.max_loras),
            "--max-cpu-loras", str(self.max_cpu_loras),
            "--max-lora-rank", str(self.max_lora_rank),
            "--threads", str(self.threads),
            "--cpu-bind", self.cpu_bind,
        ]  # fmt: skip
        if self.extra_args:
            cmd += ["--", *self.extra_args]
        # Wrapped in a watchdog so the server dies with us even if we are
        # SIGKILLed (see _WATCHDOG).
        return ["bash", "-c", _WATCHDOG, "vllm-watchdog", *cmd]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(
            {
                "VLLM_VENV": str(vllm_venv()),
                "SERVE_KV_CACHE_BYTES": str(self.kv_cache_bytes),
            }
        )
        env.pop("SERVE_API_KEY", None)
        if self.api_key:
            env["SERVE_API_KEY"] = self.api_key
        env.update(self.extra_env)
        return env

    def start(self) -> VLLMServer:
        """Spawn the server (returns at once; see wait_ready)."""
        if self.is_running():
            return self
        if self._group_alive():  # leftovers of a previous run hold the port
            self.stop()
        if not vllm_python().is_file():
            raise VLLMServerError(f"no vLLM venv at {vllm_venv()}; run ensure_vllm_installed()")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._close_log()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (kept open while running)
        self.starts += 1
        record_boot(self.name)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log_file.write(f"\n===== start #{self.starts} at {stamp} =====\n".encode())
        self._log_file.flush()
        self.process = subprocess.Popen(
            self.command(),
            cwd=REPO_ROOT,
            env=self.environment(),
            stdin=subprocess.PIPE,  # the watchdog's lifeline; never written
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop/kill reach EngineCore too
        )
        self._started_at = time.monotonic()
        self.last_start_seconds = None
        _register(self)
        return self

    def wait_ready(self, timeout: float = 120) -> float:
        """Poll GET /health then GET /v1/models until the base model is listed.

        Returns seconds since start(). Raises VLLMServerError (with the log
        tail) if the process exits or the timeout passes.
        """
        if self.process is None:
            raise VLLMServerError(f"{self.name}: not started")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise VLLMServerError(
                    f"{self.name}: exited with {code} before ready\n{self.log_tail()}"
                )
            try:
                status, _ = _http_get(self.base_url + "/health", {}, timeout=2)
                if status == 200:
                    status, body = _http_get(self.base_url + "/v1/models", headers, timeout=5)
                    cards = json.loads(body).get("data", []) if status == 200 else []
                    if self.served_name in {card.get("id") for card in cards}:
                        assert self._started_at is not None
                        self.last_start_seconds = time.monotonic() - self._started_at
                        return self.last_start_seconds
                    last = f"/v1/models -> {status}"
                else:
                    last = f"/health -> {status}"
            except (OSError, ValueError) as exc:
                last = repr(exc)
            time.sleep(0.25)
        raise VLLMServerError(
            f"{self.name}: not ready after {timeout:.0f}s ({last})\n{self.log_tail()}"
        )

    def start_and_wait(self, timeout: float = 120) -> VLLMServer:
        self.start()
        self.wait_ready(timeout)
        return self

    def stop(self, timeout: float = 20) -> None:
        """Graceful stop (SIGTERM to the group, SIGKILL after `timeout`)."""
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        self._signal_group(signal.SIGCONT)  # a frozen server must see the SIGTERM
        if not self._wait_gone(timeout):
            self._signal_group(signal.SIGKILL)
        self._reap()
        _unregister(self)

    def kill(self) -> None:
        """Simulated crash: SIGKILL the whole group, no graceful shutdown."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self._reap()
        _unregister(self)

    def restart(self, timeout: float = 120) -> float:
        """stop() then start() on the same port; returns start-up seconds.
        The new process has only the base model (runtime adapters are gone)."""
        self.stop()
        self.start()
        return self.wait_ready(timeout)

    @contextlib.contextmanager
    def down(self, *, crash: bool = False, ready_timeout: float = 120) -> Iterator[VLLMServer]:
        """Replica unavailable inside the block (connection refused), back up
        on the same port afterwards (waits until ready)."""
        if crash:
            self.kill()
        else:
            self.stop()
        try:
            yield self
        finally:
            self.start()
            self.wait_ready(ready_timeout)

    def freeze(self) -> None:
        """SIGSTOP the group: the port still accepts connections but nothing
        answers, so clients hit their timeouts (a hung replica)."""
        self._signal_group(signal.SIGSTOP)

    def unfreeze(self) -> None:
        self._signal_group(signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[VLLMServer]:
        self.freeze()
        try:
            yield self
        finally:
            self.unfreeze()

    def __enter__(self) -> VLLMServer:
        if not self.is_running():
            self.start_and_wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inspection

    def client(self, **kwargs: Any):  # -> serving.vllm_client.VLLMClient
        from serving.vllm_client import VLLMClient

        kwargs.setdefault("api_key", self.api_key)
        return VLLMClient(self.base_url, **kwargs)

    def pids(self) -> list[int]:
        """Live (non-zombie) PIDs of the server's process group: watchdog bash,
        API server, EngineCore, resource tracker."""
        if self.process is None:
            return []
        # The group outlives its leader (the watchdog bash) during shutdown.
        pgid = self.process.pid
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
        return sorted(found)

    def rss_bytes(self) -> int:
        """Summed resident memory of the process group (Linux /proc)."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_size(self) -> int:
        """Bytes in the log now: a mark for first_traceback (the log is
        appended to across restarts)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def first_traceback(self, since: int = 0, lines: int = 80) -> str:
        """The log after byte `since`, from its first traceback on (a dead
        engine logs a 500 for every request after it, which pushes the cause
        out of log_tail), or its tail where there is none."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        start = next((i for i, line in enumerate(text) if "Traceback" in line), None)
        if start is None:
            return "\n".join(text[-lines:])
        return "\n".join(text[max(0, start - 10) : start + lines])

    # -- internals

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def _group_alive(self) -> bool:
        """Any member of the process group still running (zombies excluded)."""
        if self.process is None:
            return False
        self.process.poll()  # reap the leader if it exited
        return bool(self.pids())

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_alive():
                return True
            time.sleep(0.1)
        return not self._group_alive()

    def _reap(self) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            # Members of the group can outlive the leader for a moment.
            self._wait_gone(5)
        self._close_log()

    def _close_log(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None


def start_servers(
    count: int, *, timeout: float = 180, names: Sequence[str] | None = None, **kwargs: Any
) -> list[VLLMServer]:
    """Start `count` servers at once and wait until all are ready.

    kwargs go to VLLMServer (model_dir, log_dir, max_loras, api_key, ...).
    On failure every server started here is stopped and the error re-raised.
    """
    servers = [VLLMServer(name=(names[i] if names else None), **kwargs) for i in range(count)]
    wait_all(servers, timeout=timeout, start=True)
    return servers


def wait_all(servers: Sequence[VLLMServer], *, timeout: float = 180, start: bool = False) -> None:
    """(Optionally start and) wait for several servers concurrently."""
    try:
        if start:
            for server in servers:
                server.start()
        errors: list[BaseException] = []

        def wait(server: VLLMServer) -> None:
            try:
                server.wait_ready(timeout)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=wait, args=(s,), daemon=True) for s in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
    except BaseException:
        if start:
            for server in servers:
                server.stop(timeout=5)
        raise
