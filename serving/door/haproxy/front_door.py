"""HAProxyFrontDoor: the FrontDoor (serving/door/__init__.py) on one HAProxy,
driving it through its files, its runtime API and hitless reloads through the
master CLI (the package docstring says what changes how).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from serving.door import TakenOut
from serving.door.callers import DoorAccess
from serving.door.haproxy.config import (
    HOLD_SECONDS,
    KEY_CONCURRENCY,
    MAX_BODY_BYTES,
    SOURCE_CONNECTIONS,
    SPLIT_BALANCE,
    Peer,
    _rate_tables,
    _unavailable_file,
    render_config,
)
from serving.door.haproxy.maps import (
    ACCESS_MAPS,
    ADAPTER_BACKEND_PREFIX,
    BASE_BACKEND,
    HELD_MAP,
    LEASE_MAP,
    SLOT_PREFIX,
    SLOTS,
    _map_changes,
    _write_if_changed,
    access_maps,
    backend_for,
    render_map,
)
from serving.door.haproxy.runtime import (
    BackendCounters,
    DoorError,
    RuntimeAPI,
    _checked,
)
from serving.door.routing import Route, RoutingTable, ServerState
from serving.rules.canary_gates import ServerSample

logger = logging.getLogger(__name__)

HAPROXY_PATH = "/usr/sbin:/usr/bin:/bin"
# HAProxy 2.6's per-thread pool cache (512 KiB) cannot hold a buffer of the body
# limit, so each request's two buffers went back to glibc, which unmapped them
# (its mmap threshold is 128 KiB) and mapped them again for the next request:
# about 1 ms a request here (bench/door_overhead.py). Above the buffer size,
# they stay in malloc's heap and are reused. The trim threshold gives the heap's
# free top back to the system past 32 MiB: at 256 MiB, 222 MiB that 300
# strangers' bodies had taken stayed held after they left (issue 43). At 4 MiB,
# 8 clients' small requests lost about a quarter of their throughput (the heap
# shrank and grew again between bursts); at 32 MiB, nothing measurable. What sits
# below a chunk still in use stays until HAProxy's own malloc_trim (its pool
# collection, on SIGQUIT or a failed allocation): bench/door_memory.py.
GLIBC_TUNABLES = (
    "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=33554432"
)


class HAProxyFrontDoor:
    """A FrontDoor on one HAProxy whose files (and UNIX sockets) live in
    `directory`; whatever drives it shares that directory (Kubernetes: an
    emptyDir in the door's pod)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        listen: str,
        reload_timeout: float = 60.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        metrics: str = "",
        slots: int = SLOTS,
        hold_seconds: float = HOLD_SECONDS,
        metering: bool = True,
        source_connections: int = SOURCE_CONNECTIONS,
        key_concurrency: int = KEY_CONCURRENCY,
        certificate: str = "",
        peers: tuple[Peer, ...] = (),
        peer_name: str = "",
        lease: bool = False,
    ):
        self.directory = Path(directory)
        self.lease = lease
        self.certificate = certificate
        self.peers = tuple(peers)
        self.peer_name = peer_name
        _rate_tables(self.peers, peer_name)  # a door that is not among its peers: refused now
        self.source_connections = source_connections
        self.key_concurrency = key_concurrency
        self.metering = metering
        self.slots = slots
        self.hold_seconds = hold_seconds
        self.listen = listen
        self.metrics = metrics
        self.reload_timeout = reload_timeout
        self.max_body_bytes = max_body_bytes
        self.runtime = RuntimeAPI(self.directory / "admin.sock")
        self.master = RuntimeAPI(self.directory / "master.sock")

    @property
    def config_path(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def map_path(self) -> Path:
        return (self.directory / "models.map").resolve()

    @property
    def held_map_path(self) -> Path:
        return (self.directory / HELD_MAP).resolve()

    def command_line(self) -> list[str]:
        """How to start this HAProxy (in the foreground, under a supervisor)."""
        master = f"{self.directory.resolve()}/master.sock,mode,600"
        pidfile = str((self.directory / "haproxy.pid").resolve())
        config = str(self.config_path.resolve())
        # With an empty environment: the runtime API's `show env` prints
        # HAProxy's, and the container that starts it may hold the
        # application's secrets (it writes the first configuration).
        return [
            *("env", "-i", f"PATH={HAPROXY_PATH}", GLIBC_TUNABLES),
            *("haproxy", "-W", "-db", "-S", master, "-p", pidfile, "-f", config),
            # Which of the peers this door is (the master keeps it across reloads).
            *(("-L", self.peer_name) if self.peers else ()),
        ]

    def set_peers(self, peers: tuple[Peer, ...], table: RoutingTable | None) -> str | None:
        """This door's peers from now on (doors that find each other through
        the control plane, docs/door.md#peers). Running, it takes a new
        configuration by a hitless reload, whose new worker takes the counts
        from the old one: the `-L` name stays, only the list changes. What
        changed, or None."""
        peers = tuple(sorted(set(peers), key=lambda peer: peer.name))
        if peers == self.peers:
            return None
        _rate_tables(peers, self.peer_name)  # this door among them, or refused
        with self._locked():
            self.peers = peers
            if table is None:
                return "peers set"
            if not self.runtime.available():
                self.write(table)
                return "wrote configuration"
            backends = _running_backends(table, self.runtime.map_entries(self.map_path))
            return self._reload(table, _held_states(table, self.runtime.servers(), backends))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def write(self, table: RoutingTable, states=None) -> bool:
        """Writes the configuration and map for `table`; whether either changed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        changed = _write_if_changed(self.directory / "unavailable.http", _unavailable_file())
        changed |= _write_if_changed(self.map_path, render_map(table))
        for name in ACCESS_MAPS:
            # Created empty (a closed door: no key known) until the first access
            # sync; never overwritten here, for the runtime API keeps them.
            self._access_map_path(name).touch(mode=0o600)
        # door.lua loads it when HAProxy starts; holds keep it (never overwritten here).
        self.held_map_path.touch()
        config = render_config(
            table,
            self.directory,
            listen=self.listen,
            states=states,
            max_body_bytes=self.max_body_bytes,
            metrics=self.metrics,
            slots=self.slots,
            hold_seconds=self.hold_seconds,
            metering=self.metering,
            source_connections=self.source_connections,
            key_concurrency=self.key_concurrency,
            certificate=self.certificate,
            peers=self.peers,
            peer_name=self.peer_name,
            lease=self.lease,
        )
        if self.lease:
            (self.directory / LEASE_MAP).touch(mode=0o600)
        changed |= _write_if_changed(self.config_path, config)
        return changed

    def set_lease(self, until: float) -> None:
        """The door routes until `until` (epoch seconds), then refuses with a
        503 to retry: in the running HAProxy and in the file a restarted one
        reads."""
        path = (self.directory / LEASE_MAP).resolve()
        value = int(until * 1000)
        _write_if_changed(path, f"until {value}\n", mode=0o600)
        if self.runtime.available():
            verb = "set" if "until" in self.runtime.map_entries(path) else "add"
            line = f"{verb} map {path} until {value}"
            _checked(self.runtime.command(line), line)

    # -- FrontDoor

    def apply(self, table: RoutingTable) -> list[str]:
        with self._locked():
            if not self.runtime.available():
                # Not running (yet): what it reads when it starts is current.
                return ["wrote configuration"] if self.write(table) else []
            # A worker that died holding a model left its entry: past its
            # deadline it holds nothing (door.lua), and it goes here.
            changes = self._expire_holds()
            # One `show stat` for the servers, the free slots and the balance.
            stat = self.runtime.stat()
            current = self.runtime.servers(stat)
            entries = self.runtime.map_entries(self.map_path)
            backends = _running_backends(table, entries)
            held = _held_states(table, current, backends)
            servers = {endpoint.server for endpoint in table.endpoints}
            running = {backend for backend, _ in current}
            new = sorted(m for m, backend in backends.items() if backend not in running)
            free = _free_slots(current, set(entries.values()), self.runtime.backend_counters(stat))
            # A split needs weighted round robin, which a backend takes at a reload only.
            rebalance = any(
                route.weights and self.runtime.balance(backends[model], stat) != SPLIT_BALANCE
                for model, route in table.routes.items()
            )
            # A replica the running HAProxy has no server for (every backend has
            # the same servers), or more new adapters than free slots: a reload.
            reload = not servers <= {s for b, s in current if b == BASE_BACKEND}
            if reload or rebalance or len(new) > len(free):
                changes.append(self._reload(table, held))
                current = self.runtime.servers()
                entries = self.runtime.map_entries(self.map_path)  # as the new worker read it
                backends = {model: backend_for(route) for model, route in table.routes.items()}
            else:
                for model, slot in zip(new, free, strict=False):
                    backends[model] = slot
            for model, route in table.routes.items():
                if route.held:
                    continue
                backend = backends[model]
                for server, state in route.states.items():
                    if current[(backend, server)].state != state:
                        changes.append(self._set_state(backend, server, state))
            # The map last: a new model's servers are ready before it is routed.
            # Its entries as read above: under the lock, no other writer changed them.
            changes += self._sync_map(backends, entries)
            # The files follow, so that a restarted HAProxy starts where this one is.
            self.write(table, states=held)
            return changes

    def _backend(self, model: str) -> str:
        """The backend `model` is routed to now: its own, or a slot it took."""
        answer = self.runtime.command(f"get map {self.map_path} {model}")
        match = re.search(r'value="([^"]*)"', answer)
        if match and match[1].startswith(SLOT_PREFIX):
            return match[1]
        return f"{ADAPTER_BACKEND_PREFIX}{model}"

    def drain(self, model: str, server: str, *, timeout: float, keep_one: bool = True) -> list[str]:
        with self._locked():
            backend = self._backend(model)
            servers = self.runtime.servers()
            if (backend, server) not in servers:
                return []  # nothing is routed there
            others = [
                status
                for (b, name), status in servers.items()
                if b == backend and name != server and status.state == ServerState.READY
            ]
            alone = not others and servers[(backend, server)].state == ServerState.READY
            if keep_one and alone:
                # Never leave a model without a replica: the swap happens in place
                # (its unload-load gap is the cost; docs/door.md measures it).
                return [f"kept {backend}/{server} ready: no other replica serves {model}"]
            changes = [self._set_state(backend, server, ServerState.DRAIN)]
        deadline = time.monotonic() + timeout
        while True:
            status = self.runtime.servers().get((backend, server))
            if status is None or status.in_flight == 0:
                return changes
            if time.monotonic() > deadline:
                changes.append(f"drain of {backend}/{server}: {status.in_flight} still in flight")
                return changes
            time.sleep(0.02)

    def take_out(
        self,
        model: str,
        server: str,
        *,
        timeout: float,
        hold_seconds: float,
        owner: str,
        tick: Callable[[], None] | None = None,
    ) -> TakenOut:
        """FrontDoor.take_out. Held: the hold first (a request that got past
        the door before it is already in `server`'s count), then the wait for
        `server`'s requests in flight while it is still READY (a request whose
        hold runs out meanwhile is served by the old version), then the drain
        (one whose hold runs out during the swap gets the door's 503, which
        clients retry, not vLLM's 404), and the hold renewed for the swap."""
        with self._locked():
            backend = self._backend(model)
            servers = self.runtime.servers()
            status = servers.get((backend, server))
            others = [
                name
                for (b, name), s in servers.items()
                if b == backend and name != server and s.state == ServerState.READY
            ]
            alone = status is not None and status.state == ServerState.READY and not others
            if not alone or hold_seconds <= 0:
                hold = False
            else:
                changes = self._hold(model, hold_seconds, owner)
                hold = True
        if not hold:
            return TakenOut(self.drain(model, server, timeout=timeout, keep_one=True))
        try:
            deadline = time.monotonic() + timeout
            busy = self._wait_idle(backend, server, deadline, tick)
            if not busy:
                with self._locked():
                    changes.append(self._set_state(backend, server, ServerState.DRAIN))
                # Between the read and the drain, a request whose hold ran out.
                busy = self._wait_idle(backend, server, deadline, tick)
            if busy:
                changes.append(f"drain of {backend}/{server}: {busy} still in flight")
            else:
                with self._locked():
                    changes += self._hold(model, hold_seconds, owner)
        except Exception:
            # HAProxy failed, or `tick` says the caller must stop: the hold is
            # not left behind (its deadline would end it, seconds later).
            with contextlib.suppress(DoorError):
                self.release(model, owner=owner)
            raise
        return TakenOut(changes, held=True, owner=owner, busy=busy)

    def hold(self, model: str, *, seconds: float, owner: str) -> list[str]:
        """Holds `model`'s new requests until `seconds` from now at most (a
        hold already there is moved to that deadline and owner)."""
        with self._locked():
            return self._hold(model, seconds, owner)

    def release(self, model: str, *, owner: str) -> list[str]:
        with self._locked():
            entry = self.runtime.map_entries(self.held_map_path).get(model)
            if entry is None or entry.partition("-")[2] != owner:
                return []
            line = f"del map {self.held_map_path} {model}"
            _checked(self.runtime.command(line), line)
            self._write_holds()
            return [line]

    def holds(self) -> dict[str, tuple[int, str]]:
        """The door's holds now: served name -> (deadline in epoch ms, owner)."""
        found = {}
        for model, entry in self.runtime.map_entries(self.held_map_path).items():
            deadline, _, owner = entry.partition("-")
            found[model] = (int(deadline) if deadline.isdigit() else 0, owner)
        return found

    def _hold(self, model: str, seconds: float, owner: str) -> list[str]:
        """Holds (or holds longer) `model`'s new requests, until `seconds` from
        now at most; the file follows, so a reloaded worker holds them too."""
        if not owner.isalnum():
            raise ValueError(f"a hold's owner is letters and digits, not {owner!r}")
        deadline = int((time.time() + seconds) * 1000)
        verb = "set" if model in self.runtime.map_entries(self.held_map_path) else "add"
        line = f"{verb} map {self.held_map_path} {model} {deadline}-{owner}"
        _checked(self.runtime.command(line), line)
        self._write_holds()
        return [line]

    def _expire_holds(self) -> list[str]:
        now = time.time() * 1000
        lines = [
            f"del map {self.held_map_path} {model}"
            for model, (deadline, _) in sorted(self.holds().items())
            if deadline <= now
        ]
        if lines:
            self.runtime.commands(lines)
            self._write_holds()
        return lines

    def _write_holds(self) -> None:
        entries = self.runtime.map_entries(self.held_map_path)
        text = "".join(f"{model} {entry}\n" for model, entry in sorted(entries.items()))
        _write_if_changed(self.held_map_path, text)

    def _wait_idle(self, backend: str, server: str, deadline: float, tick=None) -> int:
        """Waits until `server` has no request of `backend` in flight (HAProxy's
        own count: it includes a request still on its way to vLLM, which vLLM's
        metrics do not show yet); the count left at `deadline` (0: idle).
        `tick()` runs between reads (the caller's claim outlives a long wait)."""
        while True:
            if tick is not None:
                tick()
            status = self.runtime.servers().get((backend, server))
            if status is None or status.in_flight == 0:
                return 0
            if time.monotonic() > deadline:
                return status.in_flight
            time.sleep(0.02)

    def weigh(self, model: str, weights: dict[str, int]) -> list[str]:
        """Sets `model`'s server weights (a canary's split, or its end); each
        is one runtime command, in effect for the next request."""
        changes = []
        with self._locked():
            backend = self._backend(model)
            servers = self.runtime.servers()
            for server, weight in sorted(weights.items()):
                if (backend, server) not in servers:
                    continue
                line = f"set weight {backend}/{server} {weight}"
                _checked(self.runtime.command(line), line)
                changes.append(line)
        return changes

    def samples(self, model: str) -> tuple[str, dict[str, ServerSample]]:
        """The counters of `model`'s servers, and the worker that counted them
        (its pid: a reload starts a new count)."""
        backend = self._backend(model)
        pid = self.runtime.worker_pid()
        return str(pid), self.runtime.server_samples(backend)

    def model_counters(self) -> dict[str, BackendCounters]:
        """Each adapter's request counters (its backend m_<model>, or the slot it
        took since the last reload); the base model's and the fixed backends
        are left out."""
        in_slots = {
            backend: model
            for model, backend in self.runtime.map_entries(self.map_path).items()
            if backend.startswith(SLOT_PREFIX)
        }
        found = {}
        for backend, counters in self.runtime.backend_counters().items():
            if backend.startswith(ADAPTER_BACKEND_PREFIX):
                found[backend.removeprefix(ADAPTER_BACKEND_PREFIX)] = counters
            elif backend in in_slots:
                found[in_slots[backend]] = counters
        return found

    def ready(self, model: str, server: str) -> list[str]:
        with self._locked():
            backend = self._backend(model)
            if (backend, server) not in self.runtime.servers():
                return []  # a first load: the next sync adds the route
            return [self._set_state(backend, server, ServerState.READY)]

    def apply_access(self, access: DoorAccess) -> list[str]:
        """Makes the door enforce `access` (keys, grants, each caller's model
        list, open or not) through the runtime API: no reload, in effect for the
        next request. Cheap when nothing changed: one read of the door's flags,
        which hold the fingerprint of the table last pushed. Returns what changed
        (counts, never a key's hash)."""
        maps = access_maps(access)
        fingerprint = maps["door"]["fingerprint"]
        with self._locked():
            if not self.runtime.available():
                # Not running (yet): it reads the files when it starts.
                return self._write_access(maps)
            door_map = self._access_map_path("door")
            if self.runtime.map_entries(door_map).get("fingerprint") == fingerprint:
                return []
            changes = []
            # The flags (the fingerprint among them) go last: a push cut short
            # leaves the old fingerprint, and the next sync pushes again.
            for name in ACCESS_MAPS:
                path = self._access_map_path(name)
                lines = _map_changes(path, self.runtime.map_entries(path), maps[name])
                try:
                    self.runtime.commands(lines)
                except DoorError:
                    if name != "upstream":
                        raise
                    # Its message quotes the command, which holds the key.
                    raise DoorError("HAProxy refused the replicas' key (upstream.map)") from None
                if lines:
                    changes.append(f"{name}.map: {len(lines)} entries changed")
            self._write_access(maps)
            return changes

    def _access_map_path(self, name: str) -> Path:
        return (self.directory / f"{name}.map").resolve()

    def _write_access(self, maps: dict[str, dict[str, str]]) -> list[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name in ACCESS_MAPS:
            text = "".join(f"{key} {value}\n" for key, value in sorted(maps[name].items()))
            if _write_if_changed(self._access_map_path(name), text, mode=0o600):
                written.append(f"wrote {name}.map")
        return written

    # -- internals

    def _set_state(self, backend: str, server: str, state: ServerState) -> str:
        line = f"set server {backend}/{server} state {state}"
        if state == ServerState.READY:
            # A drain rendered into a reloaded configuration is a weight of 0.
            _checked(self.runtime.command(f"set weight {backend}/{server} 1"), line)
        _checked(self.runtime.command(line), line)
        return line

    def _sync_map(self, wanted: dict[str, str], current: dict[str, str] | None = None) -> list[str]:
        if current is None:
            current = self.runtime.map_entries(self.map_path)
        lines = _map_changes(self.map_path, current, wanted)
        for line in lines:
            _checked(self.runtime.command(line), line)
        return lines

    def _master_ready(self, deadline: float) -> None:
        """Waits until the master answers its CLI: it does once it is back in its
        loop after a re-execution. A reload asked before that is lost (seen: a
        SIGUSR2 right after a reload did nothing, a `reload` hung)."""
        while True:
            with contextlib.suppress(DoorError):
                if "master" in self.master.command("show proc"):
                    return
            if time.monotonic() > deadline:
                raise DoorError("HAProxy's master CLI does not answer")
            time.sleep(0.05)

    def _ask_master_to_reload(self, deadline: float) -> None:
        """`reload` on the master CLI, sent once: the master closes the
        connection when it re-executes itself, so the answer is not awaited."""
        self._master_ready(deadline)
        try:
            sock = self.master._connect()
        except OSError as error:
            raise DoorError(f"HAProxy's master CLI: {error}") from error
        with sock:
            sock.sendall(b"reload\n")

    def _reload(self, table: RoutingTable, held: dict) -> str:
        """New backends or servers: a new configuration, hitless. The states a
        held route has now are written into it, so a drained replica stays so."""
        started = time.monotonic()
        old_pid = self.runtime.worker_pid()
        self.write(table, states=held)
        deadline = started + self.reload_timeout
        self._ask_master_to_reload(deadline)
        while time.monotonic() < deadline:
            pid = self.runtime.worker_pid()
            if pid is not None and pid != old_pid:
                self._master_ready(deadline)  # so that the next reload is heard
                seconds = time.monotonic() - started
                return f"reload (worker {old_pid} -> {pid}, {seconds:.2f} s)"
            time.sleep(0.05)
        raise DoorError(f"HAProxy did not reload within {self.reload_timeout} s")


def _running_backends(table: RoutingTable, entries: dict[str, str]) -> dict[str, str]:
    """Each route's backend in the running HAProxy (its map entry)."""
    return {
        model: _running_backend(entries.get(model), route) for model, route in table.routes.items()
    }


def _held_states(table: RoutingTable, current: dict, backends: dict[str, str]) -> dict:
    """The states a held route's servers have now, named as a reload renders
    them: a reload keeps them (a drained replica stays so)."""
    return {
        (backend_for(route), server): status.state
        for model, route in table.routes.items()
        if route.held
        for (backend, server), status in current.items()
        if backend == backends[model]
    }


def _running_backend(entry: str | None, route: Route) -> str:
    """Where the running HAProxy routes `route`: the slot it took, if it did."""
    if entry and entry.startswith(SLOT_PREFIX):
        return entry
    return backend_for(route)


def _free_slots(current: dict, taken: set[str], counters: dict[str, BackendCounters]) -> list[str]:
    """Slots no model holds and none has used since this worker started (a
    slot a retired adapter held keeps its counts, which would be read as the
    next one's: it waits for the next reload)."""
    slots = sorted({backend for backend, _ in current if backend.startswith(SLOT_PREFIX)})
    return [
        slot
        for slot in sorted(slots, key=lambda b: int(b.removeprefix(SLOT_PREFIX)))
        if slot not in taken
        and counters.get(slot, BackendCounters(0, 0, 0)).requests == 0
        and all(s.state == ServerState.MAINT for (b, _), s in current.items() if b == slot)
    ]
