"""HAProxy as the front door: its configuration, rendered from a routing table,
and every exchange with a running HAProxy (the runtime API on a UNIX socket,
and hitless reloads through the master CLI). No other module talks to HAProxy.

The layout, one HAProxy per deployment (HAProxy 2.6, master-worker mode):
- the frontend checks the path, the key and the caller's limits on the
  headers, then buffers the request body (bounded), reads its JSON `model`
  (door.lua; routed only if it finished: docs/door.md#fail-closed) and looks
  it up in a map file: model -> backend;
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

Files in the door's directory: haproxy.cfg, models.map, admin.sock (runtime
API), master.sock (master CLI), haproxy.pid (the master's pid), unavailable.http
(the 503 of a model no replica serves right now), lock (serialises every writer
on this host), held.map (the models whose new requests the door holds while
their only replica swaps: docs/door.md#holding) and the access maps (keys,
grants, catalog, door, upstream: mode 0600; upstream.map holds the replicas'
vLLM API key, base64).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import resource
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from serving.door import TakenOut
from serving.door.callers import DoorAccess
from serving.door.routing import Route, RoutingTable, ServerState
from serving.rules.canary_gates import ServerSample

logger = logging.getLogger(__name__)

BASE_BACKEND = "base"
ADAPTER_BACKEND_PREFIX = "m_"
# Free backends rendered at every reload, one server line per replica, each in
# maint: a NEW adapter takes one at runtime (servers ready, then its map entry),
# so a promotion routes at once instead of after a reload (docs/door.md).
# The next reload renders it as m_<model> and the pool is whole again.
SLOT_PREFIX = "slot_"
SLOTS = 16
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
# The files of a door's access table (serving/door/callers.py), each a map the
# runtime API changes in place: key hash -> "department,key id,expiry";
# "department:model" -> 1; department -> its /v1/models body (base64); and the
# door's own flags ("open", and the fingerprint of the table last pushed); and
# UPSTREAM_ENTRY -> the replicas' vLLM API key (base64), sent upstream as
# `Authorization: Bearer`. A map rather than the configuration or HAProxy's
# environment: haproxy.cfg is rendered and read by more than the control plane
# and the process starts with an empty environment (`env -i`, command_line);
# a map file is 0600, changes at runtime (`set map`, no reload: a rotated key
# is in effect for the next request) and `show env` never prints it.
# versions.map: served name -> the version id it serves (for the request id).
# The door's flags (with the fingerprint) last: see apply_access.
ACCESS_MAPS = ("keys", "grants", "catalog", "upstream", "versions", "rpm", "limited", "door")
UPSTREAM_ENTRY = "replicas"
# The caller of an open door (no keys): its /v1/models lists every route.
OPEN_CALLER = "*"
# Models whose new requests the door holds (door.lua `hold_model`): served name ->
# "<deadline, epoch ms>-<owner>", changed at runtime only by the control plane.
# A request waits while its model has an entry and the deadline is ahead, at
# most HOLD_SECONDS from its arrival, then is routed as the map says then.
HELD_MAP = "held.map"
# A door that pulls its state (serving/door/agent.py): when its lease ends.
LEASE_MAP = "lease.map"
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


class DoorError(Exception):
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
    """haproxy.cfg for the table. `states` overrides the table's state of
    (backend, server) pairs: what a held route has right now. `metrics`: where
    HAProxy's Prometheus exporter listens (an internal address), or nowhere.
    `hold_seconds`: the longest a request waits for a held model (0: never).
    `metering` False leaves out the request ids and the limits: the door
    before them, bench/door_overhead.py's baseline; never the product's.
    `source_connections`: the most connections from one address (0: no
    limit); `key_concurrency`: the most requests in flight for one key.
    `certificate`: a PEM file (docs/door.md#tls); with one, the clients'
    port takes TLS only. `peers`: the doors of this deployment, this one
    `peer_name` among them, which count requests per minute together
    (docs/door.md#peers); none: this door counts alone. `lease`: a door
    that pulls its state (serving/door/agent.py) routes only until the end
    of its lease (lease.map), and answers `/door/ready` by it."""
    states = states or {}
    rates = _rate_tables(peers, peer_name)
    d = directory.resolve()
    too_large = _error(
        f"The request body is larger than {max_body_bytes} bytes.", "BadRequestError", 413
    )
    headers_too_large = _error(
        f"The request line and headers are larger than {MAX_HEADER_BYTES} bytes.",
        "BadRequestError",
        431,
    )
    connections = connection_limit()
    empty_catalog = base64.b64encode(EMPTY_CATALOG.encode()).decode()
    out = [
        f"# Rendered by the control plane for deployment {table.deployment}; do not edit.",
        "global",
        "    master-worker",
        f"    maxconn {connections * 2}",
        # A door that cannot raise its file limit still starts (logging it),
        # rather than no door at all; connection_limit() keeps the need in reach.
        "    no strict-limits",
        # The runtime API only on a UNIX socket (`level admin` can change every
        # route and print the environment): HAProxy 2.6 takes `ssl` on a TCP stats
        # socket and silently serves it in clear (checked), so there is no safe TCP form.
        f"    stats socket {d}/admin.sock mode 600 level admin expose-fd listeners",
        f"    tune.bufsize {max_body_bytes + HEADER_ROOM}",
        # The body scan (door.lua) is linear in a bounded body; this stops one
        # that runs away all the same (pure Lua time: a wait does not count).
        "    tune.lua.session-timeout 2s",
        "    tune.lua.maxmem 256",
        # door.lua's hold reads this map (Map.new at load time shares HAProxy's one
        # copy of it, which `set map` changes). 2.6's lua-load takes no arguments,
        # and the process starts with an empty environment: a path, no secret.
        f"    setenv DOOR_HELD_MAP {d}/{HELD_MAP}",
        f"    lua-load {LUA_FILE.resolve()}",
        "    log stdout format raw local0",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    timeout connect 3s",
        "    timeout client 300s",
        "    timeout server 300s",
        # The request line and headers; a body has BODY_SECONDS of its own
        # (`wait-for-body`), once its key is known.
        f"    timeout http-request {HEADER_SECONDS}s",
        "    timeout http-keep-alive 30s",
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
        # answered, with what status, for which department and key (never the key).
        # Last, the milliseconds the door held it (door.lua), or "-".
        '    log-format "%ci %ft %b %s %ST %Tt %rc %[var(txn.model)] '
        '%[var(txn.dept)] %[var(txn.key_id)] %[var(txn.held_ms)]"',
        "",
        *_peers_section(peers),
        "frontend openai",
        f"    bind {listen}{_tls_words(certificate)}",
        f"    maxconn {connections}",
        *_source_rules(source_connections),
        # Headers or a keyed body that did not arrive in time: HAProxy's 408,
        # in OpenAI's shape (never routed: a body is read whole or not at all).
        "    http-error status 408 content-type application/json string " + _quote(TIMED_OUT_BODY),
        *(_lease_rules(d) if lease else []),
        # vLLM routes the percent-decoded path (`/v1/unload_lora%5Fadapter` is
        # its unload): only a path byte for byte on the list gets through, and
        # none of them holds `%`, `//` or a dot segment, so what vLLM decodes is
        # what was compared. (2.6's `normalize-uri` is experimental; an exact
        # list needs none.) An absolute-form target is refused for the same reason.
        f"    acl client_post path {' '.join(CLIENT_POST_PATHS)}",
        f"    acl client_get path {' '.join(CLIENT_GET_PATHS)}",
        f"    acl open str(open),map({d}/door.map) -m str 1",
        "    acl known_key var(txn.caller) -m found",
        # Each refusal is answered by a backend of its own, so that HAProxy's
        # counters (and its Prometheus exporter) count each kind apart.
        "    acl refused var(txn.refusal) -m found",
        # Everything up to the body: no body byte is buffered for a request
        # refused here (no `option http-buffer-request`: `wait-for-body` below).
        "    http-request set-var(txn.refusal) str(door_404_path) if !{ url_beg / } "
        "|| !METH_POST !METH_GET || METH_POST !client_post || METH_GET !client_get",
        # (2.6 has no req.hdrs_len.)
        "    http-request set-var(txn.head_len) req.hdrs,length if !refused",
        "    http-request set-var(txn.refusal) str(door_431_headers) if !refused "
        f"{{ url,length,add(txn.head_len) gt {MAX_HEADER_BYTES} }}",
        # HAProxy's req.fhdr reads the last of several: a junk key then a valid
        # one would pass as the valid one. Two are ambiguous, so refused.
        "    http-request set-var(txn.refusal) str(door_400_authorization) if !refused "
        "{ req.fhdr_cnt(authorization) gt 1 }",
        # Keys are checked by their SHA-256 (the door never holds one in clear);
        # the value is "department|key id|expiry (epoch seconds)".
        "    http-request set-var(txn.caller) req.fhdr(authorization),word(2,' '),sha2(256),"
        f"hex,lower,map({d}/keys.map) if !refused !open "
        + "{ req.fhdr(authorization) -m reg -i ^bearer\\ +[!-~]+$ }",
        "    http-request set-var(txn.now) date if known_key",
        "    http-request set-var(txn.key_left) var(txn.caller),field(3,|),sub(txn.now) "
        "if known_key",
        "    http-request set-var(txn.refusal) str(door_401_key) if !refused !open !known_key",
        "    http-request set-var(txn.refusal) str(door_401_expired) if !refused !open "
        "{ var(txn.key_left) -m int le 0 }",
        "    http-request set-var(txn.dept) var(txn.caller),field(1,|) if known_key",
        "    http-request set-var(txn.key_id) var(txn.caller),field(2,|) if known_key",
        f"    http-request set-var(txn.dept) str({OPEN_CALLER}) if open",
        # vLLM never needs the caller's key; it gets the deployment's own, if
        # it has one (a map value is one word: base64, decoded here).
        "    http-request del-header authorization",
        f"    http-request set-var(txn.upstream) str({UPSTREAM_ENTRY}),map({d}/upstream.map) "
        "if !refused",
        '    http-request set-header authorization "Bearer %[var(txn.upstream),b64dec]" '
        "if { var(txn.upstream) -m found }",
        "    http-request set-var(txn.refusal) str(door_models) if !refused client_get",
        # A keyed request counts toward its caller's limits from here, whatever
        # the door answers it after (a 400 or a 404 too); over one, it is
        # answered before its body is read.
        *(_limit_rules(d, key_concurrency, rates) if metering else []),
        # Only now is the body buffered (at most the body limit, BODY_SECONDS).
        f"    http-request wait-for-body time {BODY_SECONDS}s if !refused",
        "    http-request set-var(txn.refusal) str(door_413_body) if !refused "
        f"{{ req.body_size gt {max_body_bytes} }}",
        f"    http-request lua.inspect_body {_quote(table.base_model)} if !refused",
        "    http-request set-var(txn.refusal) str(door_400_body) if !refused "
        "{ var(txn.body_error) -m found }",
        # Fail closed: a request is routed only when door.lua read its body to
        # the end (txn.body_read). Its error, its memory limit and its session
        # timeout it names (caught); a Lua ended from outside leaves it started
        # and never read.
        "    http-request set-var(txn.refusal) str(door_503_body_memory) if !refused "
        "{ var(txn.body_failed) -m str memory }",
        "    http-request set-var(txn.refusal) str(door_503_body_timeout) if !refused "
        "{ var(txn.body_failed) -m str timeout }",
        "    http-request set-var(txn.refusal) str(door_503_body_error) if !refused "
        "{ var(txn.body_failed) -m found }",
        "    http-request set-var(txn.refusal) str(door_503_body_timeout) if !refused "
        "{ var(txn.body_started) -m found } !{ var(txn.body_read) -m found }",
        "    http-request set-var(txn.refusal) str(door_503_body_unread) if !refused "
        "!{ var(txn.body_read) -m found }",
        # No `model` in the body: vLLM answers with its first name, the base model.
        f"    http-request set-var(txn.model) str({table.base_model}) "
        "if !refused !{ var(txn.model) -m found }",
        *(_work_rules() if metering else []),
        # A grant's value is its end (epoch seconds; 0: none), compared with the
        # door's clock: it ends on time, not at the next sync.
        "    http-request set-var(txn.grant) var(txn.dept),concat(:,txn.model),"
        f"map({d}/grants.map) if !refused !open",
        "    acl grant_over var(txn.grant),sub(txn.now) -m int le 0",
        # A model the caller may not call is one that does not exist, to it.
        f"    http-request set-var(txn.refusal) str({NOT_FOUND_BACKEND}) if !refused !open "
        "!{ var(txn.grant) -m found } || !refused !open { var(txn.grant) -m int gt 0 } "
        "grant_over",
        *_hold_rules(d, hold_seconds),
        *(_request_id_rules(d) if metering else []),
        # A reload's old worker answers each kept-alive connection it holds once
        # more, from its old maps: a model, key or grant it does not know may be
        # one only the new worker has. It asks for a retry, which the client
        # sends on a new connection (to the new worker), instead of a wrong 404
        # or 401. (Not the other way: what a key lost, the old worker may allow
        # that one last time.)
        f"    use_backend {RELOADING_BACKEND} if {{ stopping }} refused "
        f"{{ var(txn.refusal) -m str {NOT_FOUND_BACKEND} door_401_key }}",
        f"    use_backend {RELOADING_BACKEND} if {{ stopping }} !refused "
        f"!{{ var(txn.model),map({d}/models.map) -m found }}",
        # Chosen after the hold: a held request goes where the map says once it ends.
        "    use_backend %[var(txn.refusal)] if refused",
        f"    use_backend %[var(txn.model),map({d}/models.map,{NOT_FOUND_BACKEND})]",
        "",
        *_answer("door_404_path", 404, lf=NO_SUCH_PATH_BODY),
        *_answer("door_413_body", 413, fixed=too_large),
        *_answer("door_431_headers", 431, fixed=headers_too_large),
        *_answer("door_401_key", 401, fixed=NO_KEY_BODY, bearer=True),
        *_answer("door_401_expired", 401, fixed=EXPIRED_KEY_BODY, bearer=True),
        *_answer("door_400_body", 400, lf=BAD_BODY),
        *_answer("door_400_authorization", 400, fixed=TWO_KEYS_BODY),
        *(
            line
            for backend, why in UNREAD_BODIES.items()
            for line in _answer(
                backend,
                503,
                fixed=_error(
                    f"The front door did not send the request: {why}.",
                    "ServiceUnavailableError",
                    503,
                ),
            )
        ),
        # The caller's models, listed by the door (base64: a map value is one word).
        *_answer(
            "door_models",
            200,
            lf=f"%[var(txn.dept),map({d}/catalog.map,{empty_catalog}),b64dec]",
        ),
        *_answer(NOT_FOUND_BACKEND, 404, lf=NOT_FOUND_BODY),
        *_answer(RELOADING_BACKEND, 503, fixed=RELOADING_BODY, headers=(("Retry-After", "1"),)),
        *(
            _answer(LAPSED_BACKEND, 503, fixed=LAPSED_BODY, headers=(("Retry-After", "1"),))
            if lease
            else []
        ),
        *_limit_backends(rates, peers),
    ]
    if metrics:
        out += [
            # Apart from the client port: an internal listener for Prometheus
            # (docs/door.md lists the series). Not logged: a scrape is no request.
            "frontend metrics",
            f"    bind {metrics}",
            "    no log",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request return status 404",
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
            words = _server_words(endpoint)
            if state == ServerState.MAINT or state is None:
                words.append("disabled")
            elif state == ServerState.DRAIN:
                words.append("weight 0")
            elif endpoint.server in route.weights:
                # A reload keeps the canary's split.
                words.append(f"weight {route.weights[endpoint.server]}")
            out.append(" ".join(words))
        out.append("")
    for index in range(slots):
        out += [
            f"backend {SLOT_PREFIX}{index}",
            "    balance leastconn",
            "    errorfile 503 " + str(d / "unavailable.http"),
        ]
        for endpoint in table.endpoints:
            out.append(" ".join(_server_words(endpoint) + ["disabled"]))
        out.append("")
    return "\n".join(out)


def _request_id_rules(d: Path) -> list[str]:
    """The request id vLLM reports with its token counts (observability.metering):
    who called (key id) and which version serves the model, then a random part.
    Set whatever the client sent, so that no caller can bill another. After the
    hold: a held request is stamped with what serves it then."""
    return [
        f"    http-request set-var(txn.version) var(txn.model),map({d}/versions.map,0) if !refused",
        "    http-request set-header x-request-id "
        '"u1.k%[var(txn.key_id)].v%[var(txn.version)].%[uuid]"',
    ]


def _lease_rules(d: Path) -> list[str]:
    """A door that pulls its state routes only while its lease runs
    (docs/door.md#leases): lease.map's `until` (epoch ms) is renewed by the
    agent after each exchange with the control plane that succeeded. Past it
    (an agent stopped or cut off, whose state may be stale), every request
    gets a 503 to retry, and `/door/ready` fails, so that Kubernetes takes the
    door out of its Service. No lease written yet is a lapsed one."""
    return [
        "    http-request set-var(txn.now_ms) date(0,ms)",
        f"    http-request set-var(txn.lease_left) str(until),map_str_int({d}/{LEASE_MAP},0),"
        "sub(txn.now_ms)",
        "    acl door_lapsed var(txn.lease_left) -m int le 0",
        f"    http-request return status 200 content-type text/plain string ready "
        f"if {{ path {READY_PATH} }} !door_lapsed",
        f"    http-request return status 503 content-type text/plain string lapsed "
        f"if {{ path {READY_PATH} }}",
        f"    http-request set-var(txn.refusal) str({LAPSED_BACKEND}) if door_lapsed",
    ]


def _hold_rules(d: Path, hold_seconds: float) -> list[str]:
    """The hold of a model that is swapping on its only replica: a request for a
    model in held.map waits in door.lua (`core.msleep`: it yields, and a wait is
    not Lua time, so `tune.lua.session-timeout` does not end it) until the entry
    goes or its deadline passes, at most `hold_seconds`. The map lookup is
    HAProxy's, so a request for any other model never enters the Lua."""
    if hold_seconds <= 0:
        return []
    return [
        f"    http-request lua.hold_model {int(hold_seconds * 1000)} if !refused "
        f"{{ var(txn.model),map({d}/{HELD_MAP}) -m found }}",
    ]


def _server_words(endpoint) -> list[str]:
    words = [f"    server {endpoint.server} {endpoint.host}:{endpoint.port}"]
    if endpoint.tls:
        words.append(f"ssl verify required ca-file @system-ca sni str({endpoint.host})")
    return words


def _answer(
    backend: str,
    status: int,
    *,
    lf: str = "",
    fixed: str = "",
    bearer=False,
    headers: tuple[tuple[str, str], ...] = (),
) -> list:
    """A backend that answers the door's own reply (no server behind it)."""
    body = f"lf-string {_quote(lf)}" if lf else f"string {_quote(fixed)}"
    header = " hdr WWW-Authenticate Bearer" if bearer else ""
    header += "".join(f" hdr {name} {_quote(value)}" for name, value in headers)
    return [
        f"backend {backend}",
        f"    http-request return status {status} content-type application/json {body}{header}",
        "",
    ]


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


def _source_rules(connections: int) -> list[str]:
    """At most `connections` at once from one address, and at most ten times
    that opened in 10 s, closed before a byte is read (0: no limit)."""
    if connections <= 0:
        return []
    return [
        f"    tcp-request connection track-sc0 src table {SOURCE_TABLE}",
        f"    tcp-request connection reject if {{ sc0_conn_cur gt {connections} }} "
        f"|| {{ sc0_conn_rate gt {connections * 10} }}",
    ]


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


def _peers_section(peers: tuple[Peer, ...]) -> list[str]:
    if not peers:
        return []
    return [
        f"peers {PEERS_SECTION}",
        *(f"    peer {peer.name} {peer.address}" for peer in peers),
        "",
    ]


def _tls_words(certificate: str) -> str:
    """The bind's TLS: HTTP/2 or HTTP/1.1 by ALPN. A certificate without its
    key beside it in the PEM is read with `<file>.key` (HAProxy's
    ssl-load-extra-files default): cert-manager's Secret, mounted as two files."""
    if not certificate:
        return ""
    return f" ssl crt {_quote(certificate)} alpn h2,http/1.1"


def _others_rules(rates: RateTables, used: str, prefix: str, when: str) -> list[str]:
    """Adds the other doors' counts of this minute's entry (their tables, as
    the peers protocol last brought them) to `used`, this door's count; their
    sum is kept in `<prefix>_others` for door.lua's count_work."""
    if not rates.others:
        return []
    entry = f"txn.{prefix}_entry"
    lines = [
        f"    http-request set-var({entry}) var(txn.{prefix}name),concat(:,txn.rl_minute,) "
        f"if !refused {when}"
    ]
    for index, table in enumerate(rates.others):
        lines.append(
            f"    http-request set-var(txn.{prefix}_peer{index}) "
            f"var({entry}),table_gpc0({table}) if !refused {when}"
        )
    total = "int(0)" + "".join(f",add(txn.{prefix}_peer{i})" for i in range(len(rates.others)))
    lines += [
        f"    http-request set-var(txn.{prefix}_others) {total} if !refused {when}",
        f"    http-request set-var({used}) var({used}),add(txn.{prefix}_others) if !refused {when}",
    ]
    return lines


def _limit_rules(d: Path, key_concurrency: int, rates: RateTables) -> list[str]:
    """The frontend's limit checks, for a keyed request, before its body is
    read: a request the door refuses after them (a bad body, a model it may not
    call) counts all the same. Tokens first (a caller refused until a time is
    not counted), then the requests in flight for its key, then the key's
    requests per minute, then its department's (a key past its own limit does
    not use up its department's minute)."""
    kblock = "{ var(txn.rl_kblock),field(1,|),sub(txn.rl_now) -m int gt 0 }"
    dblock = "{ var(txn.rl_dblock),field(1,|),sub(txn.rl_now) -m int gt 0 }"
    blocked = "{ var(txn.rl_block) -m found }"
    when_blocked = f"if !refused {blocked}"
    key_rpm = "{ var(txn.rl_krpm) -m found }"
    dept_rpm = "{ var(txn.rl_drpm) -m found }"
    return [
        "    # --- Limits (serving/rules/quotas.py; docs/door.md, Limits)",
        "    acl rl_on var(txn.key_id) -m found",
        "    acl rl_key_over var(txn.rl_kleft) -m int lt 0",
        "    acl rl_dept_over var(txn.rl_dleft) -m int lt 0",
        '    http-request set-var-fmt(txn.rl_kname) "key:%[var(txn.key_id)]" if !refused rl_on',
        '    http-request set-var-fmt(txn.rl_dname) "dept:%[var(txn.dept)]" if !refused rl_on',
        "    http-request set-var(txn.rl_now) date if !refused rl_on",
        # Refused for tokens until a time: "until (epoch s)|limit|value".
        f"    http-request set-var(txn.rl_kblock) var(txn.rl_kname),map({d}/limited.map) "
        "if !refused rl_on",
        f"    http-request set-var(txn.rl_dblock) var(txn.rl_dname),map({d}/limited.map) "
        "if !refused rl_on",
        f"    http-request set-var(txn.rl_block) var(txn.rl_kblock) if !refused {kblock}",
        '    http-request set-var-fmt(txn.rl_scope) "key %[var(txn.key_id)]" '
        f"if !refused {blocked}",
        f"    http-request set-var(txn.rl_block) var(txn.rl_dblock) if !refused !{blocked} "
        f"{dblock}",
        '    http-request set-var-fmt(txn.rl_scope) "department %[var(txn.dept)]" '
        f"if !refused {blocked} !{{ var(txn.rl_scope) -m found }}",
        "    http-request set-var(txn.rl_retry) var(txn.rl_block),field(1,|),sub(txn.rl_now) "
        f"{when_blocked}",
        f"    http-request set-var(txn.rl_which) var(txn.rl_block),field(2,|) {when_blocked}",
        f"    http-request set-var(txn.rl_limit) var(txn.rl_block),field(3,|) {when_blocked}",
        "    http-request set-var(txn.refusal) str(door_429_tokens) if !refused "
        f"{blocked} {{ var(txn.rl_which) -m str tokens_per_minute }}",
        f"    http-request set-var(txn.refusal) str(door_429_budget) {when_blocked}",
        # Requests per minute: each caller's count in this minute (sc_inc_gpc0
        # increments and reads at once: exact across HAProxy's threads).
        "    http-request set-var(txn.rl_minute) date,div(60) if !refused rl_on",
        "    http-request set-var(txn.rl_reset) date,mod(60),neg,add(60) if !refused rl_on",
        f"    http-request set-var(txn.rl_krpm) var(txn.rl_kname),map_str_int({d}/rpm.map) "
        "if !refused rl_on",
        # Every keyed request tracks its key's entry of this minute: its
        # trackers are the key's requests in flight (HAProxy 2.6 has three
        # sticky counters, the source's, the key's and the department's). A
        # request begun in the minute before is not among them: at a minute's
        # edge a key may have up to twice its cap in flight, for a moment.
        f"    http-request track-sc1 var(txn.rl_kname),concat(:,txn.rl_minute,) table {rates.own} "
        "if !refused rl_on",
        f"    http-request set-var(txn.rl_busy_limit) int({key_concurrency}) if !refused rl_on",
        "    http-request set-var(txn.refusal) str(door_429_busy) if !refused rl_on "
        f"{{ sc_trackers(1) gt {key_concurrency} }}",
        f"    http-request set-var(txn.rl_kused) sc_inc_gpc0(1) if !refused {key_rpm}",
        *_others_rules(rates, "txn.rl_kused", "rl_k", key_rpm),
        f"    http-request set-var(txn.rl_drpm) var(txn.rl_dname),map_str_int({d}/rpm.map) "
        "if !refused rl_on",
        f"    http-request track-sc2 var(txn.rl_dname),concat(:,txn.rl_minute,) table {rates.own} "
        f"if !refused {dept_rpm}",
        f"    http-request set-var(txn.rl_dused) sc_inc_gpc0(2) if !refused {dept_rpm}",
        *_others_rules(rates, "txn.rl_dused", "rl_d", dept_rpm),
        *_rpm_over_rules(),
    ]


def _rpm_over_rules() -> list[str]:
    """What is left of the key's and the department's minute, and the 429 of
    the first one past its limit."""
    return [
        "    http-request set-var(txn.rl_kleft) var(txn.rl_krpm),sub(txn.rl_kused) "
        "if !refused { var(txn.rl_kused) -m found }",
        '    http-request set-var-fmt(txn.rl_scope) "key %[var(txn.key_id)]" '
        "if !refused rl_key_over",
        "    http-request set-var(txn.rl_limit) var(txn.rl_krpm) if !refused rl_key_over",
        "    http-request set-var(txn.refusal) str(door_429_requests) if !refused rl_key_over",
        "    http-request set-var(txn.rl_dleft) var(txn.rl_drpm),sub(txn.rl_dused) "
        "if !refused { var(txn.rl_dused) -m found }",
        '    http-request set-var-fmt(txn.rl_scope) "department %[var(txn.dept)]" '
        "if !refused rl_dept_over",
        "    http-request set-var(txn.rl_limit) var(txn.rl_drpm) if !refused rl_dept_over",
        "    http-request set-var(txn.refusal) str(door_429_requests) if !refused rl_dept_over",
    ]


def _work_rules() -> list[str]:
    """Once the body is read: a request for `n` choices of several prompts
    counts as that many (door.lua's txn.work; `count_work` adds the rest to the
    minute's counts, one increment each, as far as past the limit), and is
    checked again."""
    key_rpm = "{ var(txn.rl_krpm) -m found }"
    dept_rpm = "{ var(txn.rl_drpm) -m found }"
    more = "{ var(txn.work) -m int gt 1 }"
    counted = "{ var(txn.work_counted) -m found }"
    return [
        f"    http-request lua.count_work if !refused {more} {key_rpm} "
        f"|| !refused {more} {dept_rpm}",
        f"    http-request set-var(txn.refusal) str(door_503_work_uncounted) if !refused {more} "
        f"{key_rpm} !{counted} || !refused {more} {dept_rpm} !{counted}",
        *_rpm_over_rules(),
        # A taken request tells the caller about the tighter of its two limits,
        # as OpenAI's answers do.
        f"    http-request set-var(txn.rl_limit) var(txn.rl_krpm) if !refused {key_rpm}",
        "    http-request set-var(txn.rl_left) var(txn.rl_kleft) if !refused "
        "{ var(txn.rl_kleft) -m found }",
        f"    http-request set-var(txn.rl_limit) var(txn.rl_drpm) if !refused {dept_rpm} "
        "!{ var(txn.rl_left) -m found } || !refused { var(txn.rl_dleft),sub(txn.rl_left) "
        "-m int lt 0 }",
        f"    http-request set-var(txn.rl_left) var(txn.rl_dleft) if !refused {dept_rpm} "
        "!{ var(txn.rl_left) -m found } || !refused { var(txn.rl_dleft),sub(txn.rl_left) "
        "-m int lt 0 }",
        "    http-response set-header x-ratelimit-limit-requests %[var(txn.rl_limit)] "
        "if { var(txn.rl_left) -m found }",
        "    http-response set-header x-ratelimit-remaining-requests %[var(txn.rl_left)] "
        "if { var(txn.rl_left) -m found }",
        "    http-response set-header x-ratelimit-reset-requests %[var(txn.rl_reset)]s "
        "if { var(txn.rl_left) -m found }",
    ]


def _limit_backends(rates: RateTables, peers: tuple[Peer, ...]) -> list[str]:
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
        *_answer("door_429_requests", 429, lf=REQUESTS_BODY, headers=requests),
        *_answer("door_429_tokens", 429, lf=TOKENS_BODY, headers=tokens),
        *_answer("door_429_budget", 429, lf=BUDGET_BODY, headers=tokens),
        *_answer("door_429_busy", 429, lf=BUSY_BODY, headers=(("Retry-After", "1"),)),
        *(
            line
            for table in (rates.own, *rates.others)
            for line in (
                f"backend {table}",
                f"    stick-table type string len 96 size {RATE_TABLE_SIZE} expire 2m store gpc0"
                + (f" peers {PEERS_SECTION}" if peers else ""),
                "",
            )
        ),
        f"backend {SOURCE_TABLE}",
        f"    stick-table type ipv6 size {RATE_TABLE_SIZE} expire 1m store conn_cur,conn_rate(10s)",
        "",
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
    CLI: a UNIX socket, the only kind this module renders (docs/door.md)."""

    def __init__(self, path: Path, *, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        return sock

    def command(self, line: str) -> str:
        try:
            sock = self._connect()
        except OSError as error:
            raise DoorError(f"HAProxy at {self.path}: {error}") from error
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
                raise DoorError(f"HAProxy at {self.path}: {error}") from error
        return b"".join(chunks).decode(errors="replace")

    def commands(self, lines: list[str], *, batch: int = 200) -> None:
        """Runs each command, `batch` to a connection (`;`-separated: a table of
        thousands of keys is pushed in a few round trips, not thousands);
        raises DoorError naming the first refusal."""
        for start in range(0, len(lines), batch):
            chunk = lines[start : start + batch]
            answer = self.command(";".join(chunk))
            _checked(
                answer, chunk[0] if len(chunk) == 1 else f"{chunk[0]} (and {len(chunk) - 1} more)"
            )

    def available(self) -> bool:
        try:
            return "Pid:" in self.command("show info")
        except DoorError:
            return False

    def worker_pid(self) -> int | None:
        with contextlib.suppress(DoorError):
            for line in self.command("show info").splitlines():
                if line.startswith("Pid:"):
                    return int(line.split(":", 1)[1])
        return None

    def stat(self) -> list[dict[str, str]]:
        """One `show stat`: a row per frontend, backend and server. Read once and
        passed to servers(), backend_counters() and balance(), a caller that
        needs several of them pays one round trip and one parse."""
        return list(csv.DictReader(io.StringIO(self.command("show stat").lstrip("# "))))

    def servers(
        self, rows: list[dict[str, str]] | None = None
    ) -> dict[tuple[str, str], ServerStatus]:
        """Every (backend, server) with its admin state and requests in flight."""
        if rows is None:
            rows = self.stat()
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

    def balance(self, backend: str, rows: list[dict[str, str]] | None = None) -> str | None:
        """The backend's load-balancing algorithm, as it runs now."""
        for row in self.stat() if rows is None else rows:
            if row.get("pxname") == backend and row["svname"] == "BACKEND":
                return row.get("algo") or None
        return None

    def backend_counters(
        self, rows: list[dict[str, str]] | None = None
    ) -> dict[str, BackendCounters]:
        """Every backend's cumulative request counters (since this worker started:
        a reload starts them again at zero)."""
        if rows is None:
            rows = self.stat()
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
        raise DoorError(f"HAProxy refused {line!r}: {answer.strip()}")
    return answer


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


def _write_if_changed(path: Path, text: str, *, mode: int | None = None) -> bool:
    """Writes `text` to `path` (atomically) unless it holds it already; with
    `mode`, the file has it (from its creation on: never readable by others)."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == text:
            if mode is not None:
                path.chmod(mode)
            return False
    temporary = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    if mode is None:
        temporary.write_text(text)
    else:
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as f:
            f.write(text)
    os.replace(temporary, path)
    return True


def access_maps(access: DoorAccess) -> dict[str, dict[str, str]]:
    """The door's maps for an access table (module docstring of access.py):
    what `apply_access` pushes and writes. Department slugs and served names
    hold no space, `:` or `,` (their patterns), so the keys below are unambiguous."""
    keys = {
        digest.lower(): f"{key.department}|{key.key_id}|{key.expires_at}"
        for digest, key in access.keys.items()
    }
    # A grant's end (epoch seconds), or 0: the pair needs no grant.
    grants = {
        f"{department}:{model}": str(access.grant_ends.get((department, model), 0))
        for department, model in access.allowed
    }
    departments = {department for department, _ in access.allowed}
    catalog = {
        department: _catalog_body(access.deployment, access.models_for(department))
        for department in departments
    }
    if access.open:
        everything = sorted({model for _, model in access.allowed})
        catalog[OPEN_CALLER] = _catalog_body(access.deployment, everything)
    limited = {
        entry: f"{block.until}|{block.limit}|{block.value}"
        for entry, block in access.limited.items()
    }
    rpm = {entry: str(value) for entry, value in access.rpm.items()}
    upstream = {}
    if access.upstream_key:
        upstream[UPSTREAM_ENTRY] = base64.b64encode(access.upstream_key.encode()).decode()
    flags = {"open": "1"} if access.open else {}
    versions = {name: str(version) for name, version in access.versions.items()}
    digest = hashlib.sha256()
    for name, entries in (
        ("keys", keys),
        ("grants", grants),
        ("catalog", catalog),
        ("upstream", upstream),
        ("rpm", rpm),
        ("limited", limited),
        ("door", flags),
        ("versions", versions),
    ):
        for key, value in sorted(entries.items()):
            digest.update(f"{name} {key} {value}\n".encode())
    flags["fingerprint"] = digest.hexdigest()
    return {
        "keys": keys,
        "grants": grants,
        "catalog": catalog,
        "upstream": upstream,
        "rpm": rpm,
        "limited": limited,
        "door": flags,
        "versions": versions,
    }


def _catalog_body(deployment: str, models: list[str]) -> str:
    """`GET /v1/models` for one caller, in OpenAI's list shape: the same bytes
    on every call (a fixed `created`), no paths. Base64: a map value is one word."""
    body = {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": deployment}
            for model in models
        ],
    }
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


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


def _map_changes(path: Path, current: dict[str, str], wanted: dict[str, str]) -> list[str]:
    lines = [f"del map {path} {key}" for key in sorted(set(current) - set(wanted))]
    for key, value in sorted(wanted.items()):
        if current.get(key) != value:
            verb = "set" if key in current else "add"
            lines.append(f"{verb} map {path} {key} {value}")
    return lines
