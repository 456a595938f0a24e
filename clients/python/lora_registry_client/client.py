"""A thin client over the registry's REST API (/api/v1/, see /api/schema/).

It adds only what every pipeline would otherwise write itself: the bearer
token, errors raised with the API's own code and message, an idempotency key
derived from what is registered, and waiting for a promotion to be served.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import requests

# The states after which nothing changes any more (serving/rules/transitions.py).
ROLLOUT_DONE = {"succeeded", "failed", "rolled_back", "cancelled"}
PROMOTION_REFUSED = {"rejected", "cancelled"}
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
# Files are hashed for the idempotency key in pieces of this size, never whole.
CHUNK = 1024 * 1024
# The API's bound on a page (core/api/pagination.py).
MAX_PAGE_SIZE = 500
# How far back each poll of the events reads again: an event is stamped when
# its change is written and seen when that change commits, so one stamped a
# little earlier can appear after a later one. Seen ids are not shown twice.
FOLLOW_OVERLAP = timedelta(seconds=30)


@dataclass
class ApiError(Exception):
    """The registry refused or failed a request: its envelope, as sent."""

    status: int
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


class Unreachable(Exception):
    """No answer from the registry (connection refused, timeout, DNS)."""


class WaitTimeout(Exception):
    """The thing waited for did not happen in time; `last` is what was seen last."""

    def __init__(self, message: str, last: dict[str, Any] | None = None):
        super().__init__(message)
        self.last = last


class Client:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    # -- plumbing ---------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs) -> dict[str, Any]:
        kwargs.setdefault("timeout", self.timeout)
        try:
            response = self.session.request(method, f"{self.url}{path}", **kwargs)
        except requests.RequestException as error:
            raise Unreachable(f"{method} {path}: {error}") from error
        if response.status_code >= 400:
            raise _api_error(response)
        return response.json() if response.content else {}

    def get(self, path: str, **params) -> dict[str, Any]:
        return self.request("GET", path, params=params or None)

    def post(self, path: str, json: dict | None = None, **kwargs) -> dict[str, Any]:
        return self.request("POST", path, json=json, **kwargs)

    # -- adapters and versions ------------------------------------------------

    def find_adapter(self, department: str, name: str) -> dict[str, Any]:
        page = self.get("/api/v1/adapters/", department=department, name=name)
        for adapter in page.get("results", []):
            if adapter.get("name") == name:
                return adapter
        raise ApiError(404, "not_found", f"No adapter {department}/{name} visible to you.")

    def register(
        self,
        adapter_id: int,
        *,
        path: str | os.PathLike | None = None,
        s3_uri: str | None = None,
        mlflow_run_id: str | None = None,
        artifact_path: str = "adapter",
        idempotency_key: str | None = "auto",
        lineage: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One of `path` (a PEFT folder or an archive), `s3_uri` or `mlflow_run_id`.
        `idempotency_key="auto"` derives one from the adapter and the content."""
        given = [x for x in (path, s3_uri, mlflow_run_id) if x]
        if len(given) != 1:
            raise ValueError("give exactly one of path, s3_uri or mlflow_run_id")
        lineage = dict(lineage or {})
        if mlflow_run_id:
            return self.post(
                f"/api/v1/adapters/{adapter_id}/versions/from-mlflow-run/",
                {"run_id": mlflow_run_id, "artifact_path": artifact_path},
            )
        headers = {}
        if s3_uri:
            key = _key(idempotency_key, adapter_id, "s3", s3_uri, sorted(lineage.items()))
            if key:
                headers["Idempotency-Key"] = key
            return self.post(
                f"/api/v1/adapters/{adapter_id}/versions/",
                {"s3_uri": s3_uri, **lineage},
                headers=headers,
            )
        with _upload_parts(Path(path)) as parts:
            key = _key(
                idempotency_key,
                adapter_id,
                "files",
                [(name, _sha256(file)) for name, file in parts],
                sorted(lineage.items()),
            )
            if key:
                headers["Idempotency-Key"] = key
            with contextlib.ExitStack() as files:
                handles = [
                    ("files", (name, files.enter_context(open(file, "rb")))) for name, file in parts
                ]
                return self.request(
                    "POST",
                    f"/api/v1/adapters/{adapter_id}/versions/",
                    files=handles,
                    data=lineage,
                    headers=headers,
                )

    def version(self, version_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/versions/{version_id}/")

    def submit(self, version_id: int, comment: str = "") -> dict[str, Any]:
        return self.post(f"/api/v1/versions/{version_id}/submit/", {"comment": comment})

    # -- serving ------------------------------------------------------------------

    def promote(self, deployment: str, version_id: int, *, canary: bool | None = None) -> dict:
        body: dict[str, Any] = {"deployment": deployment, "version": version_id}
        if canary is not None:
            body["canary"] = canary
        return self.post("/api/v1/promotions/", body)

    def promotion(self, promotion_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/promotions/{promotion_id}/")

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/rollouts/{rollout_id}/")

    def wait_rollout(
        self,
        rollout_id: int,
        *,
        timeout: float = 600.0,
        interval: float = 1.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Polls until the rollout ends; reports each change of status or progress."""
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            rollout = self.rollout(rollout_id)
            now = (rollout["status"], (rollout.get("replicas_summary") or {}).get("text"))
            if now != seen and on_progress is not None:
                on_progress(rollout)
            seen = now
            if rollout["status"] in ROLLOUT_DONE:
                return rollout
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"rollout {rollout_id} still {rollout['status']}", rollout)
            time.sleep(interval)

    def wait_served(
        self,
        promotion_id: int,
        *,
        timeout: float = 600.0,
        interval: float = 1.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Waits for the promotion's approval where the deployment needs one, then
        for its rollout. Returns the ended rollout, or the refused promotion."""
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            promotion = self.promotion(promotion_id)
            if promotion["status"] != seen and on_progress is not None:
                on_progress(promotion)
            seen = promotion["status"]
            if promotion["status"] in PROMOTION_REFUSED:
                return promotion
            if promotion.get("rollout"):
                left = max(0.0, deadline - time.monotonic())
                return self.wait_rollout(
                    promotion["rollout"], timeout=left, interval=interval, on_progress=on_progress
                )
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"promotion {promotion_id} still {seen}", promotion)
            time.sleep(interval)

    # -- events -----------------------------------------------------------------

    def events(self, department: str, *, last: int = 10) -> list[dict[str, Any]]:
        """The department's `last` events (its audit log), oldest first."""
        page = self.get("/api/v1/audit-events/", department=department, page_size=last)
        return list(reversed(page.get("results", [])))

    def follow_events(
        self,
        department: str,
        *,
        last: int = 10,
        page_size: int = 100,
        interval: float = 2.0,
        polls: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The department's last `last` events, then each new one as it comes,
        oldest first, until the caller stops (Ctrl-C) or after `polls` polls.
        Polls /api/v1/audit-events/ from a cursor (the newest time seen, less
        FOLLOW_OVERLAP), `page_size` at a time, and skips the ids it has shown."""
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page size must be 1 to {MAX_PAGE_SIZE}, got {page_size}")
        shown = self.events(department, last=last) if last else []
        newest = shown[-1:] or self.events(department, last=1)
        cursor = _when(newest[0]) if newest else None
        seen: dict[int, datetime] = {}
        if cursor is not None:
            # What is there up to the newest is the past, shown or not: only what
            # comes after is new, even where it is stamped a little earlier.
            for event in self._events_since(department, cursor - FOLLOW_OVERLAP, page_size):
                if _when(event) <= cursor:
                    seen[event["id"]] = _when(event)
        for event in shown:
            seen[event["id"]] = _when(event)
            yield event
        done = 0
        while polls is None or done < polls:
            if done:
                time.sleep(interval)
            done += 1
            since = None if cursor is None else cursor - FOLLOW_OVERLAP
            for event in self._events_since(department, since, page_size):
                if event["id"] in seen:
                    continue
                when = seen[event["id"]] = _when(event)
                cursor = when if cursor is None else max(cursor, when)
                yield event
            if cursor is not None:
                # Forget what no later poll reads again: memory stays bounded.
                horizon = cursor - 2 * FOLLOW_OVERLAP
                seen = {pk: when for pk, when in seen.items() if when >= horizon}

    def _events_since(
        self, department: str, since: datetime | None, page_size: int
    ) -> Iterator[dict[str, Any]]:
        params: dict[str, Any] = {
            "department": department,
            "ordering": "created_at",
            "page_size": page_size,
        }
        if since is not None:
            params["since"] = since.isoformat()
        page = 1
        while True:
            answer = self.get("/api/v1/audit-events/", **params, page=page)
            yield from answer.get("results", [])
            if not answer.get("next"):
                return
            page += 1


def _when(event: dict[str, Any]) -> datetime:
    # Python 3.10's fromisoformat does not read the "Z" DRF writes.
    return datetime.fromisoformat(str(event["created_at"]).replace("Z", "+00:00"))


def _api_error(response: requests.Response) -> ApiError:
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    return ApiError(
        status=response.status_code,
        code=error.get("code") or f"http_{response.status_code}",
        message=error.get("message") or response.text[:500] or response.reason,
        details=error.get("details") or {},
    )


def _key(requested: str | None, *parts: Any) -> str | None:
    if requested != "auto":
        return requested
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()
    return f"lrc-{digest[:48]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _upload_parts(path: Path) -> Iterator[list[tuple[str, Path]]]:
    """(name, file) pairs to send: an archive as it is; a flat folder file by file
    (what PEFT's save_pretrained writes); a folder with sub-folders as one .tar.gz,
    since an uploaded file's name carries no folder."""
    if path.is_file():
        if not path.name.endswith(ARCHIVE_SUFFIXES) and path.suffix != ".json":
            raise ValueError(f"{path}: give a PEFT folder or a .tar, .tar.gz, .tgz or .zip")
        yield [(path.name, path)]
        return
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or folder")
    entries = sorted(p for p in path.rglob("*") if p.is_file())
    if not entries:
        raise ValueError(f"{path}: the folder is empty")
    if all(p.parent == path for p in entries):
        yield [(p.name, p) for p in entries]
        return
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / f"{path.name or 'adapter'}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for entry in entries:
                tar.add(entry, arcname=str(entry.relative_to(path)), recursive=False)
        yield [(archive.name, archive)]
