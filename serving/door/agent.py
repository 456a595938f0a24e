"""The door agent: the process beside each HAProxy of a deployment whose doors
pull their state (docs/door.md#doors-that-pull).

    python -m serving.door.agent        (environment: DOOR_*, below)

It fetches the deployment's desired door state from the control plane (a
long poll on the generation), applies it to its own HAProxy through the local
runtime socket (reloading only where the runtime API cannot apply it), waits
for the requests still in flight on what it drained, and acknowledges the
generation. It starts HAProxy itself, once it has a state, and starts it again
if it dies, from the last state it applied.

Each exchange with the control plane that succeeds renews the door's lease in
HAProxy (lease.map), counted from the moment the agent sent it. An agent
stopped or cut off stops renewing it: at its end the door refuses every
request with a 503 to retry and fails `/door/ready`, rather than route on a
state that may be stale. The control plane takes the door for gone at the same
moment (from when it last heard of it), and rollouts go on without it.

A door finds its peers (the deployment's other doors, with which it counts
requests per minute) either in DOOR_PEERS, a fixed list, or through the
control plane: with DOOR_PEER_ADDRESS (where the others reach it, e.g. the
pod's IP and port 10010) it gives that address with each report and takes
the live doors the answer lists as its `peers` section, reloading HAProxy
hitlessly when they change. A Deployment's pods have no fixed names; this
way they count together all the same (docs/door.md#peers).

No Django here, no database URL, no application secret: the door's container
holds its own token, which reads one deployment's door state and nothing else.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from serving.door.haproxy import DoorError, HAProxyFrontDoor, Peer
from serving.door.haproxy.maps import ADAPTER_BACKEND_PREFIX, SLOT_PREFIX, backend_for
from serving.door.routing import ServerState
from serving.door.state import DocumentError, DoorDocument, decode

logger = logging.getLogger("serving.door.agent")

POLL_SECONDS = 2.0  # the longest the control plane holds a poll with nothing new
HEARTBEAT_SECONDS = 1.0  # while it waits for drained requests, it still reports
HTTP_TIMEOUT_SECONDS = 5.0
START_SECONDS = 30.0  # HAProxy's first answer on its runtime socket


@dataclass(frozen=True)
class AgentConfig:
    deployment: str
    name: str
    control_plane: str
    token: str
    directory: Path
    listen: str = "0.0.0.0:8080"
    certificate: str = ""
    metrics: str = ""
    peers: tuple[Peer, ...] = ()
    # Where this door talks HAProxy's peers protocol, given to the control
    # plane, which lists the live doors' back: peers found, not configured.
    peer_address: str = ""
    lease_seconds: float = 10.0

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> AgentConfig:
        env = dict(os.environ if environ is None else environ)
        missing = [
            name
            for name in ("DOOR_DEPLOYMENT", "DOOR_CONTROL_PLANE", "DOOR_TOKEN_FILE")
            if not env.get(name)
        ]
        if missing:
            raise SystemExit(f"door agent: set {', '.join(missing)} (docs/door.md#doors-that-pull)")
        token = Path(env["DOOR_TOKEN_FILE"]).read_text().strip()
        if not token:
            raise SystemExit(f"door agent: {env['DOOR_TOKEN_FILE']} is empty")
        peers = tuple(
            Peer(name.strip(), address.strip())
            for name, _, address in (
                item.partition("=") for item in env.get("DOOR_PEERS", "").split(",") if item
            )
        )
        peer_address = env.get("DOOR_PEER_ADDRESS", "").strip()
        if peers and peer_address:
            raise SystemExit(
                "door agent: DOOR_PEERS lists the peers, DOOR_PEER_ADDRESS finds them: set one"
            )
        return cls(
            deployment=env["DOOR_DEPLOYMENT"],
            name=env.get("DOOR_NAME") or socket.gethostname(),
            control_plane=env["DOOR_CONTROL_PLANE"].rstrip("/"),
            token=token,
            directory=Path(env.get("DOOR_DIR", "/var/run/gateway")),
            listen=env.get("DOOR_LISTEN", "0.0.0.0:8080"),
            certificate=env.get("DOOR_CERTIFICATE", ""),
            metrics=env.get("DOOR_METRICS", ""),
            peers=peers,
            peer_address=peer_address,
            lease_seconds=float(env.get("DOOR_LEASE_SECONDS", "10")),
        )


class DoorAgent:
    def __init__(self, config: AgentConfig, *, session: requests.Session | None = None):
        self.config = config
        # Peers found through the control plane: this door alone until it
        # hears of others, so that HAProxy starts with its `-L` name.
        self.own_peer = (
            Peer.checked(config.name, config.peer_address) if config.peer_address else None
        )
        peers = (self.own_peer,) if self.own_peer else config.peers
        self.door = HAProxyFrontDoor(
            config.directory,
            listen=config.listen,
            certificate=config.certificate,
            metrics=config.metrics,
            peers=peers,
            peer_name=config.name if peers else "",
            lease=True,
        )
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {config.token}"
        self.process: subprocess.Popen | None = None
        self.applied: DoorDocument | None = None
        self.generation = 0
        self.busy = 0
        self.lease_until = 0.0  # epoch seconds; none yet: lapsed
        self.stopping = False
        # HAProxy is restarted by a thread of its own the moment it exits, not
        # at the loop's next turn (up to a long poll later); the lock keeps it
        # and the loop from driving HAProxy at once.
        self.lock = threading.RLock()

    # -- the control plane

    def _url(self, what: str) -> str:
        return f"{self.config.control_plane}/doors/{self.config.deployment}/{what}"

    def fetch(self, wait: float) -> tuple[int, DoorDocument | None]:
        """The state newer than what this door applied (None: unchanged after
        `wait`). Renews the lease on an answer."""
        sent = time.time()
        response = self.session.get(
            self._url("state"),
            params={"door": self.config.name, "known": str(self.generation), "wait": str(wait)},
            timeout=wait + HTTP_TIMEOUT_SECONDS,
        )
        if response.status_code == 304:
            self._renew(sent)
            return self.generation, None
        response.raise_for_status()
        body = response.json()
        document = decode(body["document"])
        self._renew(sent, document.lease_seconds)
        return int(body["generation"]), document

    def report(self, generation: int, *, follow_peers: bool = True) -> None:
        """Acknowledges `generation` (with the counters `samples` reads) and,
        finding its peers through the control plane, takes the live doors it
        lists as its peers."""
        sent = time.time()
        response = self.session.post(
            self._url("ack"),
            json={
                "door": self.config.name,
                "generation": generation,
                "busy": self.busy,
                "report": self._counters(),
                "peer_address": self.config.peer_address,
            },
            timeout=HTTP_TIMEOUT_SECONDS,
        )
        response.raise_for_status()
        self._renew(sent)
        if self.own_peer and follow_peers and response.status_code == 200:
            self.follow_peers(response.json().get("peers", []))

    def follow_peers(self, listed: list) -> None:
        """The doors the control plane lists, this one always among them (as
        it says it is): a new peers section, by a hitless reload, when they
        changed. An entry that cannot be a peer is left out."""
        if self.own_peer is None:
            return  # DOOR_PEERS: a fixed list
        peers = {self.own_peer.name: self.own_peer}
        for entry in listed:
            try:
                peer = Peer.checked(entry.get("name"), entry.get("address"))
            except (ValueError, AttributeError) as error:
                logger.warning("door %s: a listed peer left out: %s", self.config.name, error)
                continue
            peers.setdefault(peer.name, peer)
        with self.lock:
            running = self.process is not None and self.process.poll() is None
            table = self.applied.table if self.applied is not None and running else None
            change = self.door.set_peers(tuple(peers.values()), table)
            if change is None:
                return
            logger.info("door %s: peers %s: %s", self.config.name, sorted(peers), change)
            if table is not None and self.applied is not None:
                # The new worker read the routes from the files; weights,
                # holds and access go through the socket again.
                self._push_runtime(self.applied, None)

    def _renew(self, sent: float, lease: float | None = None) -> None:
        if lease is None:
            lease = self.applied.lease_seconds if self.applied else self.config.lease_seconds
        self.lease_until = sent + lease
        if self.process is not None:
            self.door.set_lease(self.lease_until)

    def _counters(self) -> dict:
        if self.applied is None or not self.door.runtime.available():
            return {}
        rows = self.door.runtime.stat()
        by_backend: dict[str, dict] = {}
        for row in rows:
            name = row.get("pxname", "")
            if row["svname"] == "BACKEND":
                by_backend.setdefault(name, {})["_"] = row
            elif row["svname"] != "FRONTEND":
                by_backend.setdefault(name, {})[row["svname"]] = row
        entries = self.door.runtime.map_entries(self.door.map_path)
        samples, counters = {}, {}
        for model in self.applied.table.routes:
            backend = entries.get(model, "")
            if not backend.startswith((ADAPTER_BACKEND_PREFIX, SLOT_PREFIX, "base")):
                continue
            servers = by_backend.get(backend, {})
            total = servers.get("_")
            if total is not None:
                counters[model] = [
                    int(total["req_tot"] or 0),
                    int(total["hrsp_4xx"] or 0),
                    int(total["hrsp_5xx"] or 0),
                ]
            samples[model] = {
                server: [
                    int(row["req_tot"] or 0) + int(row["econ"] or 0) + int(row["eresp"] or 0),
                    int(row["hrsp_5xx"] or 0) + int(row["econ"] or 0) + int(row["eresp"] or 0),
                    float(row["rtime"] or 0),
                ]
                for server, row in servers.items()
                if server != "_"
            }
        return {"epoch": self.door.runtime.worker_pid(), "samples": samples, "counters": counters}

    # -- HAProxy

    def ensure_running(self) -> None:
        """HAProxy runs, from the state last applied (a door never starts on
        none: it takes no request before it has one)."""
        if self.applied is None:
            return
        if self.process is not None and self.process.poll() is None:
            return
        if self.process is not None:
            logger.warning(
                "door %s: HAProxy exited %s; starting it again",
                self.config.name,
                self.process.returncode,
            )
        self.door.write(self.applied.table)
        self.door.set_lease(self.lease_until)
        self.process = subprocess.Popen(self.door.command_line())
        deadline = time.monotonic() + START_SECONDS
        while not self.door.runtime.available():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise DoorError(f"HAProxy did not start (exit {self.process.poll()})")
            time.sleep(0.02)
        # The files it read hold the routes; the rest goes through the socket.
        self._apply_runtime(self.applied, None)

    def apply(self, document: DoorDocument) -> None:
        with self.lock:
            before = self.applied
            self.applied = document
            if self.process is None or self.process.poll() is not None:
                self.ensure_running()
                return
            self._apply_runtime(document, before)

    def supervise(self) -> None:
        """Starts HAProxy again as soon as it exits (killed, crashed), from the
        state last applied; runs until the agent stops."""
        while not self.stopping:
            process = self.process
            if process is None:
                time.sleep(0.05)
                continue
            try:
                process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            if self.stopping:
                return
            with self.lock:
                try:
                    self.ensure_running()
                except (requests.RequestException, DoorError) as error:
                    logger.warning("door %s: %s", self.config.name, error)
                    time.sleep(0.1)

    def _apply_runtime(self, document: DoorDocument, before: DoorDocument | None) -> None:
        self._push_runtime(document, before)
        self.busy = self._wait_drained(document, before)

    def _push_runtime(self, document: DoorDocument, before: DoorDocument | None) -> None:
        door = self.door
        door.apply(document.table)
        for model, route in document.table.routes.items():
            old = before.table.routes.get(model) if before is not None else None
            old_weights = dict(old.weights) if old is not None else {}
            if dict(route.weights) != old_weights or before is None:
                if route.weights:
                    door.weigh(model, dict(route.weights))
                elif old_weights:
                    door.weigh(
                        model, {s: 1 for s, st in route.states.items() if st == ServerState.READY}
                    )
        current = door.holds()
        now_ms = time.time() * 1000
        for model, hold in document.holds.items():
            if hold.until_ms <= now_ms:
                continue
            if current.get(model) != (hold.until_ms, hold.owner):
                door.hold(model, seconds=(hold.until_ms - now_ms) / 1000, owner=hold.owner)
        for model, (_, owner) in current.items():
            if model not in document.holds:
                door.release(model, owner=owner)
        door.apply_access(document.access)

    def _wait_drained(self, document: DoorDocument, before: DoorDocument | None) -> int:
        """Waits (at most the document's drain bound) until the servers this
        state took out of a route have none of its requests in flight; still
        reporting meanwhile, so that its lease holds. The requests left."""
        drained = []
        for model, route in document.table.routes.items():
            old = before.table.routes.get(model) if before is not None else None
            for server, state in route.states.items():
                was = old.states.get(server) if old is not None else ServerState.READY
                if state != ServerState.READY and was == ServerState.READY:
                    drained.append((model, server))
        if not drained:
            return 0
        entries = self.door.runtime.map_entries(self.door.map_path)
        pairs = [
            (entries.get(model, backend_for(document.table.routes[model])), server)
            for model, server in drained
        ]
        deadline = time.monotonic() + document.drain_seconds
        next_report = time.monotonic() + HEARTBEAT_SECONDS
        while True:
            servers = self.door.runtime.servers()
            busy = sum(servers[p].in_flight for p in pairs if p in servers)
            if busy == 0 or time.monotonic() > deadline:
                return busy
            if time.monotonic() > next_report:
                next_report = time.monotonic() + HEARTBEAT_SECONDS
                self.busy = busy
                try:
                    # The one before: still draining (no reload meanwhile).
                    self.report(self.generation, follow_peers=False)
                except requests.RequestException as error:
                    logger.warning("door %s: report: %s", self.config.name, error)
            time.sleep(0.02)

    # -- the loop

    def step(self) -> None:
        """One exchange: report, then wait for a newer state and apply it."""
        if self.applied is not None:
            with self.lock:
                self.ensure_running()
            self.report(self.generation)
        # A poll renews the lease from when it was sent: it must come back well
        # within the lease, so it waits a third of it at most.
        lease = self.applied.lease_seconds if self.applied else self.config.lease_seconds
        wait = min(POLL_SECONDS, lease / 3) if self.applied is not None else 0
        generation, document = self.fetch(wait)
        if document is not None:
            self.apply(document)
            self.generation = generation
            self.report(generation)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        threading.Thread(target=self.supervise, name="haproxy-supervisor", daemon=True).start()
        backoff = 0.1
        while not self.stopping:
            try:
                self.step()
                backoff = 0.1
            except (requests.RequestException, DoorError, DocumentError, ValueError) as error:
                logger.warning("door %s: %s", self.config.name, error)
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        self.shutdown()

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def shutdown(self) -> None:
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            # HAProxy's soft stop: it finishes what it holds, then exits.
            self.process.send_signal(signal.SIGUSR1)
            try:
                self.process.wait(timeout=25)
            except subprocess.TimeoutExpired:
                self.process.kill()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    agent = DoorAgent(AgentConfig.from_environment())
    agent.run()
    sys.exit(0)


if __name__ == "__main__":
    main()
