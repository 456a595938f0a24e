"""A STAND-IN Kubernetes API server for EndpointSlices (discovery.k8s.io/v1).

No real API server can run on the build machines, so the Kubernetes discovery
tests drive the official `kubernetes` Python client against this one, over
HTTP on loopback. It serves only what discovery uses, the way kube-apiserver
does it:

- list: `GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices` (and the
  all-namespaces path) returns an `EndpointSliceList` whose
  `metadata.resourceVersion` is the store's current version;
- watch: `?watch=1&resourceVersion=N` streams chunked JSON lines
  `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}` for every change
  after N, then waits for more until `timeoutSeconds` and ends the response;
  no resourceVersion (or "0") starts with a synthetic ADDED per object;
- an N older than the compaction point gets the API server's answer: a 200 watch
  whose one event is `ERROR` carrying a `Status` with code 410 (reason Expired);
- `labelSelector` with equality (`=`, `==`, `!=`), set (`in`, `notin`) and
  existence (`k`, `!k`) requirements; an object that stops matching is sent as
  DELETED and one that starts matching as ADDED, as the watch cache does;
- `allowWatchBookmarks=true`: BOOKMARK events (only `metadata.resourceVersion`)
  while idle;
- bearer-token authentication: a wrong or missing token gets a 401 `Status`.

Not modelled: writes over HTTP (tests change objects through Python methods),
field selectors, pagination (`limit`/`continue`), server-side validation (the
tests use loopback addresses, which the real API rejects in endpoints), RBAC.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import itertools
import json
import re
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

GROUP_VERSION = "discovery.k8s.io/v1"
_PATH = re.compile(
    r"^/apis/discovery\.k8s\.io/v1(?:/namespaces/(?P<ns>[a-z0-9-]+))?/endpointslices/?$"
)
MAX_WATCH_SECONDS = 1800


# --- label selectors (this server's own parser, independent of the product's) ---


def _split(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_selector(selector: str):
    """A predicate over a labels dict; ValueError for what the API would refuse."""
    checks = []
    for requirement in _split(selector or ""):
        if match := re.fullmatch(r"([^\s!=,()]+)\s+(in|notin)\s+\(([^()]*)\)", requirement):
            key, op, values = match.group(1), match.group(2), match.group(3)
            allowed = {v.strip() for v in values.split(",")}
            if op == "in":
                checks.append(lambda labels, k=key, a=allowed: labels.get(k) in a)
            else:
                checks.append(lambda labels, k=key, a=allowed: labels.get(k) not in a)
        elif match := re.fullmatch(r"([^\s!=,()]+)\s*(==|=|!=)\s*([^\s!=,()]*)", requirement):
            key, op, value = match.groups()
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif match := re.fullmatch(r"!\s*([^\s!=,()]+)", requirement):
            checks.append(lambda labels, k=match.group(1): k not in labels)
        elif re.fullmatch(r"[^\s!=,()]+", requirement):
            checks.append(lambda labels, k=requirement: k in labels)
        else:
            raise ValueError(f"unable to parse requirement: {requirement!r}")
    return lambda labels: all(check(labels or {}) for check in checks)


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class StandInKubeAPIServer:
    """Threaded HTTP server on 127.0.0.1; use as a context manager or close()."""

    def __init__(
        self,
        *,
        token: str = "stand-in-token",  # noqa: S107 (a test credential)
        bookmark_seconds: float = 0.5,
    ):
        self.token = token
        self.bookmark_seconds = bookmark_seconds
        self._lock = threading.Condition()
        self._version = itertools.count(100)
        self.resource_version = next(self._version)
        self._objects: dict[tuple[str, str], dict] = {}
        # (version, type, object, object before the change)
        self._history: list[tuple[int, str, dict, dict | None]] = []
        self._compacted_before = 0
        self._drops = 0
        self.requests: list[dict] = []
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self.drop_watches()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StandInKubeAPIServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
                    "users": [{"name": "watcher", "user": {"token": self.token}}],
                    "contexts": [
                        {"name": "stand-in", "context": {"cluster": "stand-in", "user": "watcher"}}
                    ],
                    "current-context": "stand-in",
                }
            )
        )
        return path

    # -- changing the cluster (what the endpointslice controller would do)

    def apply_slice(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        endpoints: list[tuple[str, bool | None]],
        port: int = 8000,
        address_type: str = "IPv4",
    ) -> dict:
        """Creates or replaces a slice; endpoints are (address, ready)."""
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "addressType": address_type,
            "endpoints": [
                {
                    "addresses": [address],
                    "conditions": {"ready": ready, "serving": ready, "terminating": False}
                    if ready is not None
                    else {},
                    "targetRef": {"kind": "Pod", "namespace": namespace, "name": f"pod-{i}"},
                }
                for i, (address, ready) in enumerate(endpoints)
            ],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        }
        with self._lock:
            key = (namespace, name)
            before = self._objects.get(key)
            version = next(self._version)
            metadata = body["metadata"]
            metadata["resourceVersion"] = str(version)
            if before is None:
                metadata["uid"] = str(uuid.uuid4())
                metadata["creationTimestamp"] = _now()
                metadata["generation"] = 1
            else:
                metadata["uid"] = before["metadata"]["uid"]
                metadata["creationTimestamp"] = before["metadata"]["creationTimestamp"]
                metadata["generation"] = before["metadata"]["generation"] + 1
            self._objects[key] = body
            self._record(version, "MODIFIED" if before else "ADDED", body, before)
            return copy.deepcopy(body)

    def delete_slice(self, namespace: str, name: str) -> None:
        with self._lock:
            before = self._objects.pop((namespace, name))
            version = next(self._version)
            gone = copy.deepcopy(before)
            gone["metadata"]["resourceVersion"] = str(version)
            self._record(version, "DELETED", gone, before)

    def compact(self) -> None:
        """Forget history up to now: watches from older versions get 410 Gone."""
        with self._lock:
            self._compacted_before = self.resource_version + 1
            self._history.clear()

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (an API server restart,
        a load balancer's idle timeout)."""
        with self._lock:
            self._drops += 1
            self._lock.notify_all()

    def watch_requests(self) -> list[dict]:
        return [r for r in self.requests if r["watch"]]

    def _record(self, version, kind, body, before) -> None:
        self.resource_version = version
        self._history.append((version, kind, copy.deepcopy(body), copy.deepcopy(before)))
        self._lock.notify_all()

    # -- HTTP

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                watching = query.get("watch") in ("1", "true")
                server.requests.append(
                    {
                        "path": parts.path,
                        "watch": watching,
                        "resourceVersion": query.get("resourceVersion"),
                        "labelSelector": query.get("labelSelector"),
                    }
                )
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._json(401, _status(401, "Unauthorized", "Unauthorized"))
                route = _PATH.match(parts.path)
                if route is None:
                    missing = "the server could not find the requested resource"
                    return self._json(404, _status(404, "NotFound", missing))
                try:
                    matches = parse_selector(query.get("labelSelector", ""))
                except ValueError as error:
                    return self._json(400, _status(400, "BadRequest", str(error)))
                namespace = route.group("ns")

                def selected(obj):
                    in_namespace = namespace is None or obj["metadata"]["namespace"] == namespace
                    return in_namespace and matches(obj["metadata"].get("labels"))

                if watching:
                    try:
                        return self._watch(query, selected)
                    except (BrokenPipeError, ConnectionResetError):
                        self.close_connection = True  # the client went away: so does the watch
                        return None
                with server._lock:
                    items = [copy.deepcopy(o) for o in server._objects.values() if selected(o)]
                    version = server.resource_version
                self._json(
                    200,
                    {
                        "kind": "EndpointSliceList",
                        "apiVersion": GROUP_VERSION,
                        "metadata": {"resourceVersion": str(version)},
                        "items": sorted(items, key=lambda o: o["metadata"]["name"]),
                    },
                )

            def _chunk(self, event: dict) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, query, selected):
                try:
                    asked = int(query.get("timeoutSeconds", MAX_WATCH_SECONDS))
                    seconds = min(asked, MAX_WATCH_SECONDS)
                    since = int(query.get("resourceVersion") or 0)
                except ValueError:
                    return self._json(400, _status(400, "BadRequest", "invalid resourceVersion"))
                bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = _monotonic() + seconds
                with server._lock:
                    drops = server._drops
                    if since == 0:
                        # No version: the current state as ADDED events, then changes.
                        for obj in list(server._objects.values()):
                            if selected(obj):
                                self._chunk({"type": "ADDED", "object": obj})
                        since = server.resource_version
                    elif since < server._compacted_before:
                        message = f"too old resource version: {since} ({server._compacted_before})"
                        self._chunk({"type": "ERROR", "object": _status(410, "Expired", message)})
                        return self._end()
                    last_bookmark = _monotonic()
                    while True:
                        for version, kind, obj, before in server._history:
                            if version <= since:
                                continue
                            since = version
                            event = _filtered(kind, obj, before, selected)
                            if event:
                                self._chunk({"type": event, "object": obj})
                        if server._drops != drops:
                            # Abrupt: no final chunk, the client sees a broken stream.
                            with contextlib.suppress(OSError):
                                self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return None
                        remaining = deadline - _monotonic()
                        if remaining <= 0:
                            return self._end()
                        if bookmarks and _monotonic() - last_bookmark >= server.bookmark_seconds:
                            self._chunk(
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": "EndpointSlice",
                                        "apiVersion": GROUP_VERSION,
                                        "metadata": {"resourceVersion": str(since)},
                                    },
                                }
                            )
                            last_bookmark = _monotonic()
                        server._lock.wait(min(remaining, server.bookmark_seconds))

            def _end(self):
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client closing a kept-alive connection is not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _filtered(kind: str, obj: dict, before: dict | None, selected) -> str | None:
    now, then = selected(obj), before is not None and selected(before)
    if kind == "DELETED":
        return "DELETED" if then else None
    if now and then:
        return "MODIFIED"
    if now:
        return "ADDED"
    if then:
        return "DELETED"
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _monotonic() -> float:
    return time.monotonic()
