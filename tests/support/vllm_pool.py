"""The session's shared real vLLM servers: booted once, handed out clean.

A vLLM boot is 20-40 s of both cores here, and most real-vLLM tests only load,
call and unload adapters: they share these servers instead of booting their
own. The `vllm_pool` fixture (tests/conftest.py) is the pool of the session
(of each pytest-xdist worker under -n):

    def test_something(vllm_pool):
        a, b = vllm_pool.servers(2)      # up, listing no runtime adapter

Every server has the one configuration most tests use (STANDARD: the tiny
Llama served as "tiny-llama", max_loras 2, max_cpu_loras 4, max_lora_rank 16);
a test that needs another (other limits, an API key, extra arguments) starts a
VLLMServer of its own. servers(n) boots what is missing (in parallel) and
cleans each server it hands out: a stopped or crashed one is started again
(same port), a frozen one is continued, and every runtime adapter is unloaded.
So a test may kill, restart or freeze a shared server, and may leave adapters
loaded: the next hand-out repairs it (a restart costs that test's successor
one boot). Servers live until the session ends.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.vllm_servers import VLLMServer, wait_all

SERVED_BASE = "tiny-llama"
STANDARD = {"served_name": SERVED_BASE, "max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 16}
BOOT_TIMEOUT = 300.0  # generous: two servers and a test share two slow cores


class VLLMPool:
    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self._servers: list[VLLMServer] = []
        self.boots = 0  # servers booted fresh (restarts by clean() not counted)

    def servers(self, count: int) -> list[VLLMServer]:
        """The first `count` shared servers, each up and without runtime adapters."""
        missing = [
            VLLMServer(
                name=f"shared-{index}", model_dir=self.model_dir, log_dir=self.log_dir, **STANDARD
            )  # fmt: skip
            for index in range(len(self._servers), count)
        ]
        if missing:
            started = time.monotonic()
            wait_all(missing, timeout=BOOT_TIMEOUT, start=True)
            self._servers += missing
            self.boots += len(missing)
            print(f"\n[vllm pool] {len(missing)} shared server(s) ready in "
                  f"{time.monotonic() - started:.1f}s")  # fmt: skip
        chosen = self._servers[:count]
        clean(chosen)
        return chosen

    def stop_all(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers.clear()


def clean(servers: list[VLLMServer]) -> None:
    """Each server up (started again if a test stopped or killed it, continued if
    it froze it) and listing no runtime adapter."""
    stopped = [server for server in servers if not server.is_running()]
    for server in servers:
        server.unfreeze()
    wait_all(stopped, timeout=BOOT_TIMEOUT, start=True)
    for server in servers:
        with server.client(timeout=30) as client:
            for name in runtime_adapters(server):
                unloaded = client.unload_adapter(name)
                assert unloaded.ok, f"{server.name}: unloading {name}: {unloaded.error}"


def runtime_adapters(server: VLLMServer) -> dict[str, str | None]:
    """{served name: root} of the runtime adapters a real server lists now."""
    from serving.vllm_client import model_cards

    with server.client(timeout=30) as client:
        listing = client.list_models()
    assert listing.ok, listing.error
    return {card.id: card.root for card in model_cards(listing) if card.is_adapter}
