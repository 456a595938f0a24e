"""Door agents (serving/door/agent.py) as processes of their own, each with
its HAProxy, for the tests and benches of doors that pull their state.

Pure Python, no Django."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]


class Door:
    def __init__(self, name: str, directory: Path, listen: str):
        self.name = name
        self.directory = directory
        self.listen = listen
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def ready(self) -> int:
        try:
            return requests.get(self.url + "/door/ready", timeout=2).status_code
        except (requests.ConnectionError, requests.Timeout):
            return 0

    def haproxy_pid(self) -> int:
        return int((self.directory / "haproxy.pid").read_text().split()[0])


def complete(door: Door, model: str = "tiny-llama", key: str = "") -> requests.Response:
    """One completion through `door` (with an inference key where given)."""
    return requests.post(
        door.url + "/v1/completions",
        json={"model": model, "prompt": "The contract says", "max_tokens": 1},
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=30,
    )


def start_agent(
    door: Door,
    deployment: str,
    control_plane: str,
    token_file: Path,
    peers: str = "",
    lease: float = 3.0,
    peer_address: str = "",
):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "DOOR_DEPLOYMENT": deployment,
        "DOOR_NAME": door.name,
        "DOOR_CONTROL_PLANE": control_plane,
        "DOOR_TOKEN_FILE": str(token_file),
        "DOOR_DIR": str(door.directory),
        "DOOR_LISTEN": door.listen,
        "DOOR_PEERS": peers,
        "DOOR_PEER_ADDRESS": peer_address,
        "DOOR_LEASE_SECONDS": str(lease),
    }
    log = (door.directory.parent / f"{door.name}.log").open("ab")
    door.process = subprocess.Popen(
        [sys.executable, "-m", "serving.door.agent"],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_agent(door: Door) -> None:
    if door.process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(door.process.pid, signal.SIGCONT)
        door.process.terminate()
    try:
        door.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(door.process.pid, signal.SIGKILL)
        door.process.wait(timeout=10)
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(door.haproxy_pid(), signal.SIGKILL)


def wait_for(what, timeout: float, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(step)
