"""haproxy.cfg: the door's configuration, rendered from a routing table and the
door's options (serving/door/haproxy/haproxy.cfg is the template; what is
computed goes in as values: the rule lines of the limits and the peers, the
door's own answers, the backends and their servers).
"""

from __future__ import annotations

import base64
import functools
import re
import resource
from dataclasses import dataclass
from pathlib import Path

from django.template import Context, Engine, Template
from django.template.loaders import filesystem

from serving.door.haproxy.maps import (
    HELD_MAP,
    LEASE_MAP,
    OPEN_CALLER,
    SLOT_PREFIX,
    SLOTS,
    UPSTREAM_ENTRY,
    backend_for,
)
from serving.door.routing import RoutingTable, ServerState

NOT_FOUND_BACKEND = "not_found"
# What a reload's old worker answers where its maps are older than the new one's.
RELOADING_BACKEND = "door_503_reloading"
# The request body HAProxy buffers whole, to read `model` (SERVING_DOOR_MAX_BODY_BYTES):
# long prompts for a 128k-context model fit; a larger body gets a 413.
MAX_BODY_BYTES = 1024 * 1024
# Room in HAProxy's buffer for the request line and headers beside a body of the
# limit; a buffer this size is what each request in flight costs (twice: the
# answer has one too).
HEADER_ROOM = 64 * 1024
# The request line and headers the door takes (a 431 past it): half the room, so
# that a body of the limit always fits in the buffer behind them. Without it, a
# client's headers could fill the room and leave the door half a body to read.
MAX_HEADER_BYTES = HEADER_ROOM // 2
# The only paths a client reaches, after normalisation, each with its method:
# the OpenAI endpoints clients use. Loading adapters, /metrics, /tokenize and
# the rest of vLLM's server stay the control plane's (it calls replicas directly).
CLIENT_POST_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CLIENT_GET_PATHS = ("/v1/models",)
LUA_FILE = Path(__file__).with_name("door.lua")
# Memory a stranger can make the door hold (docs/door.md#memory). A body is
# read only after its key, path and limits are checked (`wait-for-body`), so a
# caller without a key costs the request line and headers, for at most
# HEADER_SECONDS. Requests in flight are at most MAX_CONNECTIONS (each may hold
# a body of the limit: about 0.8 GiB of bodies at the default limit), at most
# SOURCE_CONNECTIONS from one address (0: none, for a door behind a router,
# where every client has the router's) and KEY_CONCURRENCY for one key.
MAX_CONNECTIONS = 768
# What HAProxy asks of the file-descriptor limit: about four per client
# connection (global maxconn is twice the frontend's, two descriptors each),
# plus listeners, peers and the runtime socket.
FDS_PER_CONNECTION = 4
FD_RESERVE = 64
SOURCE_CONNECTIONS = 256
KEY_CONCURRENCY = 32
HEADER_SECONDS = 5
# The longest a keyed caller takes to send its body once its headers are in.
BODY_SECONDS = 10
READY_PATH = "/door/ready"
LAPSED_BACKEND = "door_503_lease"
HOLD_SECONDS = 20.0

# vLLM 0.32 answers an unknown model with this shape ("The model `x` does not
# exist. Valid aliases: ..."). The front door leaves out the list of names: it
# serves every department's adapters, and would tell anyone what exists. A model
# the caller may not call gets the very same answer.
NOT_FOUND_BODY = (
    '{"error":{"message":"The model `%[var(txn.model),json(utf8s)]` does not exist.",'
    '"type":"NotFoundError","param":"model","code":404}}'
)
UNAVAILABLE_BODY = (
    '{"error":{"message":"No replica serves the model `%[var(txn.model),json(utf8s)]` '
    'right now; try again shortly.","type":"ServiceUnavailableError","param":"model",'
    '"code":503}}'
)


def _error(message: str, kind: str, code, param: str | None = None) -> str:
    """OpenAI's error shape (the `openai` client maps the status to its exception)."""
    param_json = "null" if param is None else f'"{param}"'
    code_json = code if isinstance(code, int) else f'"{code}"'
    return (
        f'{{"error":{{"message":"{message}","type":"{kind}","param":{param_json},'
        f'"code":{code_json}}}}}'
    )


NO_SUCH_PATH_BODY = _error(
    "Invalid URL (%[method] %[path,json(utf8s)])", "invalid_request_error", "not_found"
)
NO_KEY_BODY = _error(
    "Incorrect API key provided. Send a key of this deployment as Authorization: Bearer <key>.",
    "invalid_request_error",
    "invalid_api_key",
)
EXPIRED_KEY_BODY = _error("The API key has expired.", "invalid_request_error", "invalid_api_key")
BAD_BODY = (
    '{"error":{"message":"%[var(txn.body_error),json(utf8s)]","type":"BadRequestError",'
    '"param":"%[var(txn.body_param),json(utf8s)]","code":400}}'
)
TIMED_OUT_BODY = _error(
    f"The request did not arrive in time: its headers have {HEADER_SECONDS} s, "
    f"its body {BODY_SECONDS} s after them.",
    "invalid_request_error",
    408,
)
TWO_KEYS_BODY = _error(
    "Send one Authorization header; this request has several.",
    "invalid_request_error",
    "invalid_api_key",
)
# Fail closed: what the door answers when its body reader did not finish, each
# from a backend of its own (counted apart). The request is never routed.
UNREAD_BODIES = {
    "door_503_body_error": "its body reader failed",
    "door_503_body_memory": "its body reader ran out of memory",
    "door_503_body_timeout": "its body reader ran out of time",
    "door_503_body_unread": "its body reader gave no verdict",
    "door_503_work_uncounted": "its count of the request's work did not finish",
}
BUSY_BODY = _error(
    "Too many requests in flight for key %[var(txn.key_id)]: limit %[var(txn.rl_busy_limit)]. "
    "Retry when one of them ends.",
    "requests",
    "rate_limit_exceeded",
)
EMPTY_CATALOG = '{"object":"list","data":[]}'
LAPSED_BODY = _error(
    "The front door has not heard from the control plane in time; retry.",
    "ServiceUnavailableError",
    503,
)
RELOADING_BODY = _error(
    "The front door is reloading its routes; retry the request.", "ServiceUnavailableError", 503
)


SPLIT_BALANCE = "roundrobin"


def _quote(text: str) -> str:
    """A double-quoted HAProxy configuration word."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def connection_limit() -> int:
    """MAX_CONNECTIONS, or fewer where this process may not open the files they
    need. HAProxy refuses to start when it cannot raise its file limit to what
    its maxconn asks (seen: a container with nofile 1024:1024, as podman gives,
    and the door never came up); the door and the process that renders its
    configuration run with the same limits (one container, or one pod)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, (hard - FD_RESERVE) // FDS_PER_CONNECTION))


# --- Limits (issue 32): requests per minute counted here, tokens refused from
# the `limited` map the control plane computes from metering (serving/rules/quotas.py).
# Both answer 429 in OpenAI's shape with Retry-After and x-ratelimit-* headers,
# which the `openai` client turns into RateLimitError and waits on before it
# retries (it retries a 429 only when Retry-After is at most 120 s: a spent
# budget's renewal, hours away, is not retried).

# Calendar minutes (UTC), counted per caller entry and minute: an exact count
# and an exact reset (the minute's end), where a sliding rate (http_req_rate)
# could only estimate when a request would be taken again. A burst across a
# minute's edge may get twice the limit in 60 s, as with every fixed window.
RATE_TABLE = "door_rates"
RATE_TABLE_SIZE = 200_000
SOURCE_TABLE = "door_sources"
REQUESTS_BODY = _error(
    "Rate limit reached for %[var(txn.rl_scope)] on requests per min (RPM): "
    "Limit %[var(txn.rl_limit)]. Please try again in %[var(txn.rl_reset)]s.",
    "requests",
    "rate_limit_exceeded",
)
TOKENS_BODY = _error(
    "Rate limit reached for %[var(txn.rl_scope)] on tokens per min (TPM): "
    "Limit %[var(txn.rl_limit)]. Please try again in %[var(txn.rl_retry)]s.",
    "tokens",
    "rate_limit_exceeded",
)
BUDGET_BODY = _error(
    "%[var(txn.rl_scope)] has used its token budget (%[var(txn.rl_which)]: "
    "%[var(txn.rl_limit)]); it renews in %[var(txn.rl_retry)]s.",
    "insufficient_quota",
    "insufficient_quota",
)


# What may stand in a `peer <name> <address>` line: names as the doors'
# (DNS labels, pod names), an address as host:port, [IPv6]:port or IPv6:port
# (HAProxy takes the last colon's digits as the port; a pod's IPv6 address
# comes bare from the kubelet's `$(POD_IP):10010`).
DOOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
PEER_ADDRESS = re.compile(
    r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]|[0-9A-Fa-f:.]{2,45}):[0-9]{1,5}$"
)


@dataclass(frozen=True)
class Peer:
    """One door of a deployment's peers: its fixed name (HAProxy's `-L`) and
    the address where it talks the peers protocol to the others."""

    name: str
    address: str

    @classmethod
    def checked(cls, name: str, address: str) -> Peer:
        """A peer from what another process said: refused (ValueError) unless
        both fit a configuration line."""
        if not (isinstance(name, str) and DOOR_NAME.match(name)):
            raise ValueError(f"not a door name: {name!r}")
        if not (isinstance(address, str) and PEER_ADDRESS.match(address)):
            raise ValueError(f"not a peer address (host:port): {address!r}")
        return cls(name, address)


PEERS_SECTION = "door_peers"


@dataclass(frozen=True)
class RateTables:
    """Where a door counts requests per minute: its own table, and the other
    doors' tables it adds to its count (none for a door alone)."""

    own: str
    others: tuple[str, ...] = ()


def _rate_tables(peers: tuple[Peer, ...], peer_name: str) -> RateTables:
    if not peers:
        return RateTables(RATE_TABLE)
    names = [peer.name for peer in peers]
    if peer_name not in names:
        raise ValueError(f"this door ({peer_name!r}) is not among its peers {names}")
    # Peers do not add counts up: on one shared table the last writer's value
    # wins (docs/door.md#peers). Each door writes its own table only; every
    # table is replicated to every door, which reads the others' and adds.
    return RateTables(
        f"{RATE_TABLE}_{peer_name}",
        tuple(f"{RATE_TABLE}_{name}" for name in names if name != peer_name),
    )


def render_config(
    table: RoutingTable,
    directory: Path,
    *,
    listen: str,
    states: dict[tuple[str, str], ServerState] | None = None,
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
) -> str:
    """haproxy.cfg for the table (the template beside this module). `states`
    overrides the table's state of (backend, server) pairs: what a held route
    has right now. `metrics`: where HAProxy's Prometheus exporter listens (an
    internal address), or nowhere. `hold_seconds`: the longest a request waits
    for a held model (0: never). `metering` False leaves out the request ids
    and the limits: the door before them, bench/door_overhead.py's baseline;
    never the product's. `source_connections`: the most connections from one
    address (0: no limit); `key_concurrency`: the most requests in flight for
    one key. `certificate`: a PEM file (docs/door.md#tls); with one, the
    clients' port takes TLS only. `peers`: the doors of this deployment, this
    one `peer_name` among them, which count requests per minute together
    (docs/door.md#peers); none: this door counts alone. `lease`: a door that
    pulls its state (serving/door/agent.py) routes only until the end of its
    lease (lease.map), and answers `/door/ready` by it."""
    rates = _rate_tables(peers, peer_name)
    d = directory.resolve()
    connections = connection_limit()
    context = {
        "deployment": table.deployment,
        "d": d,
        "global_maxconn": connections * 2,
        "connections": connections,
        "bufsize": max_body_bytes + HEADER_ROOM,
        "held_map": HELD_MAP,
        "lease_map": LEASE_MAP,
        "lua_file": LUA_FILE.resolve(),
        "header_seconds": HEADER_SECONDS,
        "body_seconds": BODY_SECONDS,
        "peers": peers,
        "peers_section": PEERS_SECTION,
        "listen": listen,
        # The bind's TLS: HTTP/2 or HTTP/1.1 by ALPN. A certificate without its
        # key beside it in the PEM is read with `<file>.key` (HAProxy's
        # ssl-load-extra-files default): cert-manager's Secret, as two files.
        "tls": f" ssl crt {_quote(certificate)} alpn h2,http/1.1" if certificate else "",
        "source_connections": source_connections,
        "source_rate": source_connections * 10,
        "source_table": SOURCE_TABLE,
        "timed_out_body": _quote(TIMED_OUT_BODY),
        "lease": lease,
        "ready_path": READY_PATH,
        "lapsed_backend": LAPSED_BACKEND,
        "client_post_paths": " ".join(CLIENT_POST_PATHS),
        "client_get_paths": " ".join(CLIENT_GET_PATHS),
        "open_caller": OPEN_CALLER,
        "upstream_entry": UPSTREAM_ENTRY,
        "metering": metering,
        "key_concurrency": key_concurrency,
        "rate_table": rates.own,
        "other_tables": rates.others,
        "rate_tables": (rates.own, *rates.others),
        "rate_table_size": RATE_TABLE_SIZE,
        "max_header_bytes": MAX_HEADER_BYTES,
        "max_body_bytes": max_body_bytes,
        "base_model": table.base_model,
        "base_model_word": _quote(table.base_model),
        "not_found_backend": NOT_FOUND_BACKEND,
        "reloading_backend": RELOADING_BACKEND,
        "hold_ms": int(hold_seconds * 1000) if hold_seconds > 0 else 0,
        "answers": _answers(d, max_body_bytes, lease),
        "metrics": metrics,
        "unavailable_file": d / "unavailable.http",
        "backends": [*_route_backends(table, states or {}), *_slot_backends(table, slots)],
    }
    # No localisation: numbers as Python writes them, and no settings needed
    # (bench/swap_through_gateway.py renders before Django is set up).
    rendered = _template().render(Context(context, autoescape=False, use_l10n=False))
    return rendered.rstrip("\n") + "\n"


@functools.cache
def _template() -> Template:
    """haproxy.cfg, read once. A line that holds only template tags or
    comments leaves nothing behind, its line ending included (Jinja's
    trim_blocks; Django's engine has none): the template reads as the
    configuration it renders."""
    engine = Engine(loaders=[(f"{__name__}._TrimmedLoader", [TEMPLATE_DIR])], autoescape=False)
    return engine.get_template("haproxy.cfg")


class _TrimmedLoader(filesystem.Loader):
    def get_contents(self, origin) -> str:
        return _TAGS_ALONE.sub(lambda line: line[1].strip(), super().get_contents(origin))


TEMPLATE_DIR = Path(__file__).parent
_TAGS_ALONE = re.compile(r"^[ \t]*((?:\{[%#].*?[%#]\}[ \t]*)+)\n", re.MULTILINE)


@dataclass(frozen=True)
class _Backend:
    name: str
    balance: str
    servers: list[str]


def _route_backends(table: RoutingTable, states: dict) -> list[_Backend]:
    """A backend per model, a server line per replica in the state its route
    gives it (or a held route has now: `states`). Generation times vary a lot:
    the replica with the fewest requests in flight. A canary's split is
    weighted round robin instead: weighted leastconn gives a light server
    nothing until the heavy ones have `weight` requests in flight each, so at
    a few clients a 10 % canary would get none."""
    backends = []
    for route in sorted(table.routes.values(), key=backend_for):
        name = backend_for(route)
        servers = []
        for endpoint in table.endpoints:
            state = states.get((name, endpoint.server), route.states.get(endpoint.server))
            words = _server_words(endpoint)
            if state == ServerState.MAINT or state is None:
                words.append("disabled")
            elif state == ServerState.DRAIN:
                words.append("weight 0")
            elif endpoint.server in route.weights:
                # A reload keeps the canary's split.
                words.append(f"weight {route.weights[endpoint.server]}")
            servers.append(" ".join(words))
        balance = SPLIT_BALANCE if route.weights else "leastconn"
        backends.append(_Backend(name, balance, servers))
    return backends


def _slot_backends(table: RoutingTable, slots: int) -> list[_Backend]:
    """The free slots a new adapter takes at runtime, every server in maint."""
    servers = [" ".join([*_server_words(endpoint), "disabled"]) for endpoint in table.endpoints]
    return [_Backend(f"{SLOT_PREFIX}{index}", "leastconn", servers) for index in range(slots)]


def _server_words(endpoint) -> list[str]:
    words = [f"    server {endpoint.server} {endpoint.host}:{endpoint.port}"]
    if endpoint.tls:
        words.append(f"ssl verify required ca-file @system-ca sni str({endpoint.host})")
    return words


@dataclass(frozen=True)
class _Answer:
    """A backend that answers the door's own reply (no server behind it)."""

    backend: str
    status: int
    words: str  # the body and its headers, as `http-request return` takes them


def _answer(
    backend: str,
    status: int,
    *,
    lf: str = "",
    fixed: str = "",
    bearer=False,
    headers: tuple[tuple[str, str], ...] = (),
) -> _Answer:
    body = f"lf-string {_quote(lf)}" if lf else f"string {_quote(fixed)}"
    header = " hdr WWW-Authenticate Bearer" if bearer else ""
    header += "".join(f" hdr {name} {_quote(value)}" for name, value in headers)
    return _Answer(backend, status, body + header)


def _answers(d: Path, max_body_bytes: int, lease: bool) -> list[_Answer]:
    """Every answer of the door's own, in the configuration's order."""
    too_large = _error(
        f"The request body is larger than {max_body_bytes} bytes.", "BadRequestError", 413
    )
    headers_too_large = _error(
        f"The request line and headers are larger than {MAX_HEADER_BYTES} bytes.",
        "BadRequestError",
        431,
    )
    empty_catalog = base64.b64encode(EMPTY_CATALOG.encode()).decode()
    retry = (("Retry-After", "1"),)
    requests = (
        ("Retry-After", "%[var(txn.rl_reset)]"),
        ("x-ratelimit-limit-requests", "%[var(txn.rl_limit)]"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "%[var(txn.rl_reset)]s"),
    )
    tokens = (
        ("Retry-After", "%[var(txn.rl_retry)]"),
        ("x-ratelimit-limit-tokens", "%[var(txn.rl_limit)]"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "%[var(txn.rl_retry)]s"),
    )
    return [
        _answer("door_404_path", 404, lf=NO_SUCH_PATH_BODY),
        _answer("door_413_body", 413, fixed=too_large),
        _answer("door_431_headers", 431, fixed=headers_too_large),
        _answer("door_401_key", 401, fixed=NO_KEY_BODY, bearer=True),
        _answer("door_401_expired", 401, fixed=EXPIRED_KEY_BODY, bearer=True),
        _answer("door_400_body", 400, lf=BAD_BODY),
        _answer("door_400_authorization", 400, fixed=TWO_KEYS_BODY),
        *(
            _answer(
                backend,
                503,
                fixed=_error(
                    f"The front door did not send the request: {why}.",
                    "ServiceUnavailableError",
                    503,
                ),
            )
            for backend, why in UNREAD_BODIES.items()
        ),
        # The caller's models, listed by the door (base64: a map value is one word).
        _answer(
            "door_models",
            200,
            lf=f"%[var(txn.dept),map({d}/catalog.map,{empty_catalog}),b64dec]",
        ),
        _answer(NOT_FOUND_BACKEND, 404, lf=NOT_FOUND_BODY),
        _answer(RELOADING_BACKEND, 503, fixed=RELOADING_BODY, headers=retry),
        *([_answer(LAPSED_BACKEND, 503, fixed=LAPSED_BODY, headers=retry)] if lease else []),
        _answer("door_429_requests", 429, lf=REQUESTS_BODY, headers=requests),
        _answer("door_429_tokens", 429, lf=TOKENS_BODY, headers=tokens),
        _answer("door_429_budget", 429, lf=BUDGET_BODY, headers=tokens),
        _answer("door_429_busy", 429, lf=BUSY_BODY, headers=retry),
    ]


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
