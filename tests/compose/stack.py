"""docker-compose.yml started under podman, for the compose tier (tests/compose).

Debian's docker-compose (1.29) drives podman through podman's Docker-compatible
API (`podman system service`, on a socket of this run's own). On a machine that
cannot pull, docker-compose.standin.yml swaps the third-party images for the
stand-in built here (scripts/compose/build.sh); the product's services run as
docker-compose.yml ships them.

Without systemd, podman runs no health check on its own (it schedules them with
systemd timers): `HealthPump` runs `podman healthcheck run` at each container's
own interval in their place, so `depends_on: service_healthy` and the
healthchecks mean what they mean under Docker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = "lar-compose-test"
CONTAINERS_CONF = REPO / "scripts" / "compose" / "containers.conf"


def podman_env() -> dict[str, str]:
    # scripts/compose/test.sh may name a copy that adds the runtime this host needs.
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    env.pop("DOCKER_HOST", None)
    return env


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        env=podman_env(),
    )


class HealthPump(threading.Thread):
    """Runs each project container's health check at its interval (podman's
    systemd timers, where there is no systemd)."""

    def __init__(self, project: str) -> None:
        super().__init__(daemon=True, name="health-pump")
        self.project = project
        self.stopping = threading.Event()
        self.last: dict[str, float] = {}
        self.interval: dict[str, float | None] = {}

    def _interval(self, cid: str) -> float | None:
        if cid not in self.interval:
            out = podman("inspect", "--format", "{{json .Config.Healthcheck}}", cid, check=False)
            check = json.loads(out.stdout or "null") if out.returncode == 0 else None
            if not check or not check.get("Test") or check["Test"][0] == "NONE":
                self.interval[cid] = None
            else:
                self.interval[cid] = (check.get("Interval") or 30_000_000_000) / 1e9
        return self.interval[cid]

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            listed = podman(
                "ps",
                "-q",
                "--no-trunc",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                check=False,
            )
            for cid in listed.stdout.split():
                every = self._interval(cid)
                if every is None or time.monotonic() - self.last.get(cid, 0.0) < every:
                    continue
                self.last[cid] = time.monotonic()
                # Its result is recorded in the container's health state; a check
                # that fails is the point of some tests, so no exception here.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    podman("healthcheck", "run", cid, timeout=30, check=False)


class Stack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "podman.sock"
        self.service: subprocess.Popen | None = None
        self.pump: HealthPump | None = None
        standin = os.environ.get("COMPOSE_STANDIN", "1") == "1"
        self.files = ["docker-compose.yml"] + (["docker-compose.standin.yml"] if standin else [])

    # -- the engine ---------------------------------------------------------
    def start_engine(self) -> None:
        log = (self.workdir / "podman-service.log").open("wb")
        self.service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=podman_env(),
        )
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: {log.name}")
            time.sleep(0.2)
        if not Path("/run/systemd/system").is_dir():
            self.pump = HealthPump(PROJECT)
            self.pump.start()

    def stop_engine(self) -> None:
        if self.pump:
            self.pump.stopping.set()
            self.pump.join(timeout=40)
        if self.service and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.service.kill()

    # -- compose --------------------------------------------------------------
    def compose(
        self, *args: str, timeout: float = 600, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        found = shutil.which("docker-compose")
        assert found, "docker-compose is required (scripts/compose/test.sh installs it)"
        cmd = [found, "-p", PROJECT]
        for f in self.files:
            cmd += ["-f", str(REPO / f)]
        env = dict(podman_env(), DOCKER_HOST=f"unix://{self.socket}", COMPOSE_HTTP_TIMEOUT="300")
        result = subprocess.run(
            [*cmd, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
            env=env,
            input=stdin,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"docker-compose {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def exec(self, service: str, *args: str, stdin: str | None = None, check: bool = True):
        return self.compose("exec", "-T", service, *args, stdin=stdin, check=check, timeout=300)

    def containers(self, service: str | None = None) -> list[dict]:
        filters = ["--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = podman("ps", "-a", "-q", "--no-trunc", *filters).stdout.split()
        if not ids:
            return []
        return json.loads(podman("inspect", *ids).stdout)

    def container(self, service: str) -> dict:
        found = self.containers(service)
        assert len(found) == 1, f"{service}: {len(found)} containers"
        return found[0]

    def health(self, service: str) -> str:
        state = self.container(service)["State"]
        health = state.get("Health") or state.get("Healthcheck") or {}
        return health.get("Status") or state.get("Status", "")

    def wait_healthy(self, services: list[str], timeout: float) -> float:
        started = time.monotonic()
        while True:
            states = {s: self.health(s) for s in services}
            if all(v == "healthy" for v in states.values()):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"not healthy after {timeout:.0f} s: {states}\n{self.logs()}")
            time.sleep(2)

    def logs(self, *services: str, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", *services, check=False).stdout

    def down(self) -> None:
        self.compose("--profile", "cpu", "down", "-v", "--remove-orphans", "-t", "20", check=False)

    @contextlib.contextmanager
    def running(self) -> Iterator[Stack]:
        self.start_engine()
        try:
            yield self
        finally:
            try:
                self.down()
            finally:
                self.stop_engine()
