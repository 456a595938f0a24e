"""HAProxy as the front door: its configuration, rendered from a routing table,
and every exchange with a running HAProxy (the runtime API on a UNIX socket,
and hitless reloads through the master CLI). No other module talks to HAProxy.

The layout, one HAProxy per deployment (HAProxy 2.6, master-worker mode):
- the frontend buffers the request body (bounded), reads its JSON `model`
  and looks it up in a map file: model -> backend;
- one backend per model (the base model's and one per adapter), with a server
  line for every replica, each READY, DRAIN or MAINT as the table says;
- a model that is not in the map gets vLLM's 404 (OpenAI's error shape).

What changes at runtime and how:
- a replica gains or loses an adapter, a swap drains one replica: `set server
  <backend>/<server> state ready|drain|maint` (no reload);
- an adapter is retired: `del map` (at once a 404; its backend goes at the next reload);
- an adapter or a replica is added: the configuration is written again and the
  master reloads it (`reload` on the master CLI). The master keeps the listening
  sockets, so no connection is refused; the old worker finishes its requests.

Files in the gateway's directory: haproxy.cfg, models.map, admin.sock (runtime
API), master.sock (master CLI), haproxy.pid (the master's pid), unavailable.http
(the 503 of a model no replica serves right now), lock (serialises every writer
on this host).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from serving.canary_gates import ServerSample
from serving.gateway.routing import Route, RoutingTable, ServerState

logger = logging.getLogger(__name__)

BASE_BACKEND = "base"
ADAPTER_BACKEND_PREFIX = "m_"
NOT_FOUND_BACKEND = "not_found"
# The request body HAProxy buffers to read `model`: OpenAI requests are small;
# a longer one gets a 413 instead of being routed by a truncated body.
MAX_BODY_BYTES = 256 * 1024

# vLLM 0.32 answers an unknown model with this shape ("The model `x` does not
# exist. Valid aliases: ..."). The front door leaves out the list of names: it
# serves every department's adapters, and would tell anyone what exists.
NOT_FOUND_BODY = (
    '{"error":{"message":"The model `%[var(txn.model),json(utf8s)]` does not exist.",'
    '"type":"NotFoundError","param":"model","code":404}}'
)
TOO_LARGE_BODY = (
    '{"error":{"message":"The request body is larger than '
    f'{MAX_BODY_BYTES} bytes.","type":"BadRequestError","param":null,"code":413}}}}'
)
UNAVAILABLE_BODY = (
    '{"error":{"message":"No replica serves the model `%[var(txn.model),json(utf8s)]` '
    'right now; try again shortly.","type":"ServiceUnavailableError","param":"model",'
    '"code":503}}'
)
# Clients get the OpenAI API only: loading adapters and the metrics stay the
# control plane's (it calls the replicas directly).
BLOCKED_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/metrics")


SPLIT_BALANCE = "roundrobin"


class GatewayError(Exception):
    """HAProxy refused a command or does not answer."""


def backend_for(route: Route) -> str:
    # Served names are [A-Za-z0-9._-] (registry.models.SERVED_NAME_PATTERN), all
    # legal in a backend name; the prefix keeps them apart from the fixed ones.
    return BASE_BACKEND if route.base else f"{ADAPTER_BACKEND_PREFIX}{route.model}"


def _quote(text: str) -> str:
    """A double-quoted HAProxy configuration word."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_map(table: RoutingTable) -> str:
    lines = [f"{model} {backend_for(route)}" for model, route in sorted(table.routes.items())]
    return "\n".join(lines) + "\n"


def render_config(
    table: RoutingTable,
    directory: Path,
    *,
    listen: str,
    states: dict[tuple[str, str], ServerState] | None = None,
    admin_port: int | None = None,
) -> str:
    """haproxy.cfg for the table. `states` overrides the table's state of
    (backend, server) pairs: what a held route has right now."""
    states = states or {}
    d = directory.resolve()
    out = [
        f"# Rendered by the control plane for deployment {table.deployment}; do not edit.",
        "global",
        "    master-worker",
        (
            # Reachable by the pods of the control plane only (a NetworkPolicy).
            f"    stats socket ipv4@0.0.0.0:{admin_port} level admin"
            if admin_port
            else f"    stats socket {d}/admin.sock mode 660 level admin expose-fd listeners"
        ),
        f"    tune.bufsize {MAX_BODY_BYTES + 16384}",
        "    log stdout format raw local0",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    timeout connect 3s",
        "    timeout client 300s",
        "    timeout server 300s",
        "    timeout http-request 30s",
        # A reload soft-stops the old worker: it answers an idle keep-alive
        # connection's next request (with Connection: close) instead of closing
        # it under a client that is sending one (seen: RemoteDisconnected).
        "    option idle-close-on-response",
        "    option redispatch 1",
        "    retries 2",
        # A replica that answers 404 for a model the map routes to it has lost the
        # adapter (a restart the reconcile has not seen yet): another one may have it.
        # Such answers are counted from vLLM's log (bench/swap_through_gateway.py).
        "    retry-on conn-failure empty-response 404",
        # One line per request: which backend (model) and which server (replica)
        # answered, with what status; bench/swap_through_gateway.py counts from it.
        '    log-format "%ci %ft %b %s %ST %Tt %rc %[var(txn.model)]"',
        "",
        "frontend openai",
        f"    bind {listen}",
        "    option http-buffer-request",
        f"    http-request return status 413 content-type application/json string "
        f"{_quote(TOO_LARGE_BODY)} if {{ req.body_size gt {MAX_BODY_BYTES} }}",
        "    http-request return status 404 content-type application/json string "
        + _quote('{"detail":"Not Found"}')
        + " if { path_beg "
        + " ".join(BLOCKED_PATHS)
        + " }",
        "    http-request set-var(txn.model) req.body,json_query('$.model') if { method POST }",
        # No `model` in the body: vLLM answers with its base model, so does the front door.
        f"    use_backend {BASE_BACKEND} unless {{ var(txn.model) -m found }}",
        f"    use_backend %[var(txn.model),map({d}/models.map,{NOT_FOUND_BACKEND})]",
        "",
        f"backend {NOT_FOUND_BACKEND}",
        "    http-request return status 404 content-type application/json lf-string "
        + _quote(NOT_FOUND_BODY),
        "",
    ]
    for route in sorted(table.routes.values(), key=backend_for):
        backend = backend_for(route)
        out += [
            f"backend {backend}",
            # Generation times vary a lot: the replica with the fewest requests in
            # flight. A canary's split is weighted round robin instead: weighted
            # leastconn gives a light server nothing until the heavy ones have
            # `weight` requests in flight each, so at a few clients a 10 % canary
            # would get none.
            f"    balance {SPLIT_BALANCE if route.weights else 'leastconn'}",
            "    errorfile 503 " + str(d / "unavailable.http"),
        ]
        for endpoint in table.endpoints:
            state = states.get((backend, endpoint.server), route.states.get(endpoint.server))
            words = [f"    server {endpoint.server} {endpoint.host}:{endpoint.port}"]
            if endpoint.tls:
                words.append(f"ssl verify required ca-file @system-ca sni str({endpoint.host})")
            if state == ServerState.MAINT or state is None:
                words.append("disabled")
            elif state == ServerState.DRAIN:
                words.append("weight 0")
            elif endpoint.server in route.weights:
                # A reload keeps the canary's split.
                words.append(f"weight {route.weights[endpoint.server]}")
            out.append(" ".join(words))
        out.append("")
    return "\n".join(out)


def _unavailable_file() -> str:
    body = UNAVAILABLE_BODY.replace("%[var(txn.model),json(utf8s)]", "")
    body = body.replace("the model `` right now", "this model right now")
    return (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        "Cache-Control: no-cache\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )


@dataclass(frozen=True)
class ServerStatus:
    backend: str
    server: str
    state: ServerState
    in_flight: int  # requests being served plus queued


@dataclass(frozen=True)
class BackendCounters:
    requests: int
    errors_4xx: int
    errors_5xx: int


class RuntimeAPI:
    """HAProxy's runtime API (the stats socket, `level admin`) or its master
    CLI: a UNIX socket path, or "host:port" where HAProxy runs in another pod."""

    def __init__(self, path: Path | str, *, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        if isinstance(self.path, Path):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address = str(self.path)
        else:
            host, _, port = self.path.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (host, int(port))
        sock.settimeout(self.timeout)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock

    def command(self, line: str) -> str:
        try:
            sock = self._connect()
        except OSError as error:
            raise GatewayError(f"HAProxy at {self.path}: {error}") from error
        with sock:
            try:
                sock.sendall(line.encode() + b"\n")
                # The master CLI keeps a connection open for more commands; the
                # end of our input tells it (and the worker's socket) we are done.
                sock.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            except OSError as error:
                raise GatewayError(f"HAProxy at {self.path}: {error}") from error
        return b"".join(chunks).decode(errors="replace")

    def available(self) -> bool:
        try:
            return "Pid:" in self.command("show info")
        except GatewayError:
            return False

    def worker_pid(self) -> int | None:
        with contextlib.suppress(GatewayError):
            for line in self.command("show info").splitlines():
                if line.startswith("Pid:"):
                    return int(line.split(":", 1)[1])
        return None

    def servers(self) -> dict[tuple[str, str], ServerStatus]:
        """Every (backend, server) with its admin state and requests in flight."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        found = {}
        for row in rows:
            if row["svname"] in ("FRONTEND", "BACKEND") or not row.get("pxname"):
                continue
            status = row["status"]
            if status.startswith("MAINT"):
                state = ServerState.MAINT
            elif status.startswith("DRAIN") or row.get("weight") == "0":
                state = ServerState.DRAIN
            else:
                state = ServerState.READY
            in_flight = int(row["scur"] or 0) + int(row["qcur"] or 0)
            found[(row["pxname"], row["svname"])] = ServerStatus(
                row["pxname"], row["svname"], state, in_flight
            )
        return found

    def server_samples(self, backend: str) -> dict[str, ServerSample]:
        """Each server's cumulative counters in `backend` (since this worker
        started). Errors: 5xx answers, and connections or responses that failed."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        found = {}
        for row in rows:
            if row.get("pxname") != backend or row["svname"] in ("FRONTEND", "BACKEND"):
                continue
            failed = int(row["econ"] or 0) + int(row["eresp"] or 0)
            found[row["svname"]] = ServerSample(
                requests=int(row["req_tot"] or 0) + failed,
                errors=int(row["hrsp_5xx"] or 0) + failed,
                latency_ms=float(row["rtime"] or 0),
            )
        return found

    def balance(self, backend: str) -> str | None:
        """The backend's load-balancing algorithm, as it runs now."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        for row in rows:
            if row.get("pxname") == backend and row["svname"] == "BACKEND":
                return row.get("algo") or None
        return None

    def backend_counters(self) -> dict[str, BackendCounters]:
        """Every backend's cumulative request counters (since this worker started:
        a reload starts them again at zero)."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        return {
            row["pxname"]: BackendCounters(
                requests=int(row["req_tot"] or 0),
                errors_4xx=int(row["hrsp_4xx"] or 0),
                errors_5xx=int(row["hrsp_5xx"] or 0),
            )
            for row in rows
            if row.get("svname") == "BACKEND" and row.get("pxname")
        }

    def map_entries(self, map_path: Path) -> dict[str, str]:
        entries = {}
        for line in self.command(f"show map {map_path}").splitlines():
            parts = line.split()
            if len(parts) == 3:  # <ref id> <key> <value>
                entries[parts[1]] = parts[2]
        return entries


def _checked(answer: str, line: str) -> str:
    # The runtime API answers errors in plain text (and success mostly with nothing).
    lowered = answer.lower()
    if any(word in lowered for word in ("unknown", "no such", "not found", "error", "require")):
        raise GatewayError(f"HAProxy refused {line!r}: {answer.strip()}")
    return answer


class HAProxyFrontDoor:
    """A FrontDoor on one HAProxy whose files live in `directory`."""

    def __init__(
        self,
        directory: Path | str,
        *,
        listen: str,
        admin: str = "",
        reload_timeout: float = 60.0,
    ):
        """`admin`: "" for UNIX sockets in `directory` (HAProxy on this host), or
        the "host:port" of its runtime API on another host (Kubernetes: its own
        pod; the master CLI is on port + 1, the directory a shared volume)."""
        self.directory = Path(directory)
        self.listen = listen
        self.admin = admin
        self.reload_timeout = reload_timeout
        if admin:
            host, _, port = admin.rpartition(":")
            self.runtime = RuntimeAPI(admin)
            self.master = RuntimeAPI(f"{host}:{int(port) + 1}")
        else:
            self.runtime = RuntimeAPI(self.directory / "admin.sock")
            self.master = RuntimeAPI(self.directory / "master.sock")

    @property
    def config_path(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def map_path(self) -> Path:
        return (self.directory / "models.map").resolve()

    def command_line(self) -> list[str]:
        """How to start this HAProxy (in the foreground, under a supervisor)."""
        if self.admin:
            master = f"ipv4@0.0.0.0:{int(self.admin.rpartition(':')[2]) + 1}"
        else:
            master = f"{self.directory.resolve()}/master.sock,mode,660"
        pidfile = str((self.directory / "haproxy.pid").resolve())
        config = str(self.config_path.resolve())
        return ["haproxy", "-W", "-db", "-S", master, "-p", pidfile, "-f", config]

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
        admin_port = int(self.admin.rpartition(":")[2]) if self.admin else None
        config = render_config(
            table, self.directory, listen=self.listen, states=states, admin_port=admin_port
        )
        changed |= _write_if_changed(self.config_path, config)
        return changed

    # -- FrontDoor

    def apply(self, table: RoutingTable) -> list[str]:
        with self._locked():
            if not self.runtime.available():
                # Not running (yet): what it reads when it starts is current.
                return ["wrote configuration"] if self.write(table) else []
            current = self.runtime.servers()
            held = {
                key: status.state
                for key, status in current.items()
                if key[0] in {backend_for(r) for r in table.routes.values() if r.held}
            }
            wanted = {
                (backend_for(route), endpoint.server)
                for route in table.routes.values()
                for endpoint in table.endpoints
            }
            changes = []
            # A split needs weighted round robin, which a backend takes at a reload only.
            rebalance = any(
                route.weights and self.runtime.balance(backend_for(route)) != SPLIT_BALANCE
                for route in table.routes.values()
            )
            if not wanted <= set(current) or rebalance:
                changes.append(self._reload(table, held))
                current = self.runtime.servers()
            for route in table.routes.values():
                if route.held:
                    continue
                backend = backend_for(route)
                for server, state in route.states.items():
                    if current[(backend, server)].state != state:
                        changes.append(self._set_state(backend, server, state))
            changes += self._sync_map(table)
            # The files follow, so that a restarted HAProxy starts where this one is.
            self.write(table, states=held)
            return changes

    def drain(self, model: str, server: str, *, timeout: float, keep_one: bool = True) -> list[str]:
        backend = f"m_{model}"
        with self._locked():
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
                # (its unload-load gap is the cost; docs/gateway.md measures it).
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

    def weigh(self, model: str, weights: dict[str, int]) -> list[str]:
        """Sets `model`'s server weights (a canary's split, or its end); each
        is one runtime command, in effect for the next request."""
        backend = f"{ADAPTER_BACKEND_PREFIX}{model}"
        changes = []
        with self._locked():
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
        backend = f"{ADAPTER_BACKEND_PREFIX}{model}"
        pid = self.runtime.worker_pid()
        return str(pid), self.runtime.server_samples(backend)

    def model_counters(self) -> dict[str, BackendCounters]:
        """Each adapter's request counters (its backend m_<model>); the base
        model's and the fixed backends are left out."""
        return {
            backend.removeprefix(ADAPTER_BACKEND_PREFIX): counters
            for backend, counters in self.runtime.backend_counters().items()
            if backend.startswith(ADAPTER_BACKEND_PREFIX)
        }

    def ready(self, model: str, server: str) -> list[str]:
        backend = f"m_{model}"
        with self._locked():
            if (backend, server) not in self.runtime.servers():
                return []  # a first load: the next sync adds the route
            return [self._set_state(backend, server, ServerState.READY)]

    # -- internals

    def _set_state(self, backend: str, server: str, state: ServerState) -> str:
        line = f"set server {backend}/{server} state {state}"
        if state == ServerState.READY:
            # A drain rendered into a reloaded configuration is a weight of 0.
            _checked(self.runtime.command(f"set weight {backend}/{server} 1"), line)
        _checked(self.runtime.command(line), line)
        return line

    def _sync_map(self, table: RoutingTable) -> list[str]:
        current = self.runtime.map_entries(self.map_path)
        wanted = {model: backend_for(route) for model, route in table.routes.items()}
        changes = []
        for model in sorted(set(current) - set(wanted)):
            line = f"del map {self.map_path} {model}"
            _checked(self.runtime.command(line), line)
            changes.append(line)
        for model, backend in sorted(wanted.items()):
            if current.get(model) == backend:
                continue
            verb = "set" if model in current else "add"
            line = f"{verb} map {self.map_path} {model} {backend}"
            _checked(self.runtime.command(line), line)
            changes.append(line)
        return changes

    def _master_ready(self, deadline: float) -> None:
        """Waits until the master answers its CLI: it does once it is back in its
        loop after a re-execution. A reload asked before that is lost (seen: a
        SIGUSR2 right after a reload did nothing, a `reload` hung)."""
        while True:
            with contextlib.suppress(GatewayError):
                if "master" in self.master.command("show proc"):
                    return
            if time.monotonic() > deadline:
                raise GatewayError("HAProxy's master CLI does not answer")
            time.sleep(0.05)

    def _ask_master_to_reload(self, deadline: float) -> None:
        """`reload` on the master CLI, sent once: the master closes the
        connection when it re-executes itself, so the answer is not awaited."""
        self._master_ready(deadline)
        try:
            sock = self.master._connect()
        except OSError as error:
            raise GatewayError(f"HAProxy's master CLI: {error}") from error
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
        raise GatewayError(f"HAProxy did not reload within {self.reload_timeout} s")


def _write_if_changed(path: Path, text: str) -> bool:
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == text:
            return False
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return True
