"""HAProxy's runtime API and master CLI: UNIX sockets in the door's directory
(the only kind the configuration renders, docs/door.md), one command per
connection, and what the answers of `show stat` and `show map` say.
"""

from __future__ import annotations

import contextlib
import csv
import io
import socket
from dataclasses import dataclass
from pathlib import Path

from serving.door.routing import ServerState
from serving.rules.canary_gates import ServerSample


class DoorError(Exception):
    """HAProxy refused a command or does not answer."""


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
