"""The conformance tier's server pool boots the next architecture's vLLM while
this one's cases run, and keeps at most AHEAD + 1 servers alive (no vLLM here: the
servers are stand-ins that record what was asked of them)."""

from __future__ import annotations

from tests.conformance import conftest


class Recorded:
    def __init__(self, architecture: str, log: list[str]) -> None:
        self.architecture, self.log = architecture, log

    def wait_ready(self, timeout: float) -> None:
        self.log.append(f"ready {self.architecture}")

    def stop(self) -> None:
        self.log.append(f"stop {self.architecture}")


def test_the_next_server_boots_while_this_one_serves_and_each_stops_when_done(
    monkeypatch, tmp_path
):
    log: list[str] = []

    def start(architecture, model_dir, cases, log_dir):
        log.append(f"start {architecture} ({cases} cases)")
        return Recorded(architecture, log)

    monkeypatch.setattr(conftest, "start_server", start)
    monkeypatch.setattr(conftest.ServerPool, "AHEAD", 2)
    order = ["qwen2", "llama", "phi3", "gemma3"]
    pool = conftest.ServerPool(order, tmp_path)
    pool.specs = {name: (tmp_path / name, 2) for name in order}

    for architecture in order:
        pool.get(architecture)
        assert len(pool.servers) <= 3
        pool.done(architecture)

    assert log == [
        "start qwen2 (2 cases)",
        "start llama (2 cases)",  # both booting while qwen2's cases run
        "start phi3 (2 cases)",
        "ready qwen2",
        "stop qwen2",
        "start gemma3 (2 cases)",
        "ready llama",
        "stop llama",
        "ready phi3",
        "stop phi3",
        "ready gemma3",
        "stop gemma3",
    ]
    assert pool.servers == {}
