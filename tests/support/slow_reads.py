"""A slow volume under ONE real vLLM server, for the fault tier: strace attaches
to the server's processes and holds every open of one adapter's weights for a
while, as a slow network volume would. A test can then kill the replica while
vLLM is inside the read of that adapter, and know that it was: strace's log
shows the open of the weights before the kill.

    with SlowReads(server, staged_folder, seconds=20, log=tmp_path / "strace.log") as slow:
        ... send the load ...
        assert slow.wait_reading(timeout=60)
        server.kill()

Needs strace and the right to ptrace the server (root, or ptrace_scope 0).
Nothing in vLLM is changed: the delay is in the open(2) system calls.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

from tests.support.vllm_servers import VLLMServer

WEIGHTS = "adapter_model.safetensors"


def strace_available() -> bool:
    return shutil.which("strace") is not None


class SlowReads:
    def __init__(self, server: VLLMServer, folder: Path | str, *, seconds: float, log: Path):
        self.server = server
        self.folder = Path(folder)
        self.seconds = seconds
        self.log = log
        self._process: subprocess.Popen | None = None

    def _server_pids(self) -> list[int]:
        """The API server and its EngineCore (where the LoRA worker reads), not
        the watchdog shells around them."""
        pids = []
        for pid in self.server.pids():
            try:
                command = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if command != "bash":
                pids.append(pid)
        return pids

    def __enter__(self) -> SlowReads:
        pids = self._server_pids()
        assert pids, f"{self.server.name} runs no process to trace"
        attach = [arg for pid in pids for arg in ("-p", str(pid))]
        # The first matching open is the config, which is let through; every
        # open of the weights after it waits `seconds` before it returns.
        self._process = subprocess.Popen(
            [
                "strace",
                "-f",
                *attach,
                "-P",
                str(self.folder / "adapter_config.json"),
                "-P",
                str(self.folder / WEIGHTS),
                "-e",
                "trace=openat",
                "-e",
                f"inject=openat:delay_exit={int(self.seconds * 1_000_000)}:when=2+",
                "-o",
                str(self.log),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        attached: set[str] = set()
        deadline = time.monotonic() + 30
        assert self._process.stderr is not None
        while len(attached) < len(pids) and time.monotonic() < deadline:
            line = self._process.stderr.readline()
            if not line:
                raise AssertionError(f"strace stopped before attaching: {self._process.wait()}")
            if " attached" in line:
                attached.add(line.split()[2])
        assert len(attached) == len(pids), f"strace attached to {attached}, not all of {pids}"
        # Keep reading what it says (threads attached, detached) so it never blocks on us.
        threading.Thread(target=self._process.stderr.read, daemon=True).start()
        return self

    def reading(self) -> bool:
        """vLLM has opened the adapter's weights (and is held inside the read)."""
        try:
            return WEIGHTS in self.log.read_text()
        except OSError:
            return False

    def wait_reading(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.reading():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()  # detaches from whatever still runs
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
