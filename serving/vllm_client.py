"""Small synchronous HTTP client for one vLLM OpenAI-compatible server.

Used by the rollout tasks (no Django import here). Every call returns an
`AttemptResult` describing exactly one HTTP attempt; nothing raises for HTTP
or network errors, and nothing retries: retry policy belongs to the caller,
which uses `AttemptResult.transient` to decide.

Contract notes (vLLM 0.32/0.33, see shared notes vllm-lora.md):
- `POST /v1/load_lora_adapter` answers 200 with a PLAIN TEXT body.
- Errors are JSON `{"error": {"message": ...}}`; FastAPI's own errors
  (e.g. a missing route when runtime LoRA updating is off) are
  `{"detail": "Not Found"}`.
- vLLM reports adapter validation failures (rank too big, wrong shapes,
  unknown target modules) as 500: those are permanent, not transient.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, Self

import requests
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

# Status codes worth retrying: the server is (re)starting, overloaded or a
# proxy in front of it could not reach it.
TRANSIENT_STATUS = frozenset({408, 429, 502, 503, 504})
MAX_ERROR_CHARS = 2000
# /v1/models with a few thousand adapters is well under 1 MiB; nothing vLLM
# answers comes near this.
MAX_RESPONSE_BYTES = 16 * 1024**2
MIN_LOAD_INPLACE_VERSION = (0, 33)


@dataclass(frozen=True)
class AttemptResult:
    """One HTTP attempt against a vLLM server."""

    method: str
    url: str
    started_at: datetime
    duration_ms: float
    status_code: int | None
    ok: bool
    # vLLM's error message ("" when ok).
    error: str
    # True when retrying the same call later may succeed.
    transient: bool
    # Parsed JSON when the body is JSON, else the text ("" without a body).
    body: Any

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form, e.g. for storing in an attempt log."""
        return {
            "method": self.method,
            "url": self.url,
            "started_at": self.started_at.isoformat(),
            "duration_ms": round(self.duration_ms, 3),
            "status_code": self.status_code,
            "ok": self.ok,
            "error": self.error,
            "transient": self.transient,
            "body": self.body,
        }


class ModelCard(NamedTuple):
    """One entry of GET /v1/models. Adapters have `parent` = base served name.
    A named tuple: a tick builds one per adapter per replica (32 x 500), at
    less than half a frozen dataclass's cost."""

    id: str
    root: str | None
    parent: str | None

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None


def model_cards(result: AttemptResult) -> list[ModelCard]:
    """Cards of a successful `list_models()` result ([] otherwise)."""
    if not result.ok or not isinstance(result.body, dict):
        return []
    cards = []
    for item in result.body.get("data") or []:
        if isinstance(item, dict) and "id" in item:
            cards.append(ModelCard(str(item["id"]), item.get("root"), item.get("parent")))
    return cards


def server_version(result: AttemptResult) -> str | None:
    """Version string of a successful `version()` result."""
    if result.ok and isinstance(result.body, dict) and isinstance(result.body.get("version"), str):
        return result.body["version"]
    return None


def parse_version(version: str | None) -> Version | None:
    """A server's version string as PEP 440 ('0.33.0rc1+cpu'), None if unreadable."""
    try:
        return Version((version or "").strip())
    except InvalidVersion:
        return None


def supports_load_inplace(version: str | None) -> bool:
    """True when `load_inplace` is safe to use (fixed in vLLM 0.33.0, #33791).

    Up to 0.32.x the flag exists but sticks, and the adapter is re-read from
    disk every engine step; callers should unload then load instead. A
    pre-release of 0.33 already has the fix.
    """
    parsed = parse_version(version)
    return parsed is not None and parsed.release[:2] >= MIN_LOAD_INPLACE_VERSION


def is_already_loaded_error(result: AttemptResult) -> bool:
    """Load of a name that is already loaded (400 'has already been loaded')."""
    return result.status_code == 400 and "has already been loaded" in result.error


def is_not_found_error(result: AttemptResult) -> bool:
    """Unload of a name the server does not know (404 'cannot be found').

    Deliberately False for a missing route (`{"detail": "Not Found"}`), which
    means runtime LoRA updating is disabled on that server; see
    `is_route_missing_error`.
    """
    return result.status_code == 404 and "cannot be found" in result.error


def is_route_missing_error(result: AttemptResult) -> bool:
    """404 from FastAPI itself: the route does not exist on this server
    (VLLM_ALLOW_RUNTIME_LORA_UPDATING is not set)."""
    return result.status_code == 404 and result.error.strip() == "Not Found"


def extract_error(body: Any, text: str) -> str:
    """vLLM's error message from a JSON or text error body."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if detail is not None:
            # FastAPI 422: a list of {"loc", "msg", "type"}.
            if isinstance(detail, list):
                msgs = [d.get("msg", "") if isinstance(d, dict) else str(d) for d in detail]
                joined = "; ".join(m for m in msgs if m)
                if joined:
                    return joined
            return json.dumps(detail)[:MAX_ERROR_CHARS]
        if body.get("message"):
            return str(body["message"])
    return (text or "").strip()[:MAX_ERROR_CHARS]


class ResponseTooLarge(Exception):
    pass


def _read_capped(response: requests.Response, limit: int, deadline: float) -> str:
    """The body as text, refusing one past `limit` bytes (after decompression, so
    a gzip bomb counts at its real size) or still arriving after `deadline`:
    a replica, or whatever answers at its address, must not exhaust a worker."""
    chunks, size = [], 0
    for chunk in response.iter_content(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(f"response body larger than {limit} bytes")
        if time.perf_counter() > deadline:
            raise ResponseTooLarge("response body still arriving after the timeout")
        chunks.append(chunk)
    return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")


def _parse_body(text: str, content_type: str) -> Any:
    if not text:
        return ""
    stripped = text.lstrip()
    if "json" in content_type or stripped[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


class VLLMClient:
    """Client for one vLLM server (one replica).

    `base_url` is the server root, e.g. "http://10.0.0.5:8000" (a trailing
    "/v1" is tolerated and removed). `api_key` is sent as
    `Authorization: Bearer <key>` and never logged or shown in repr.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 3.0,
        load_timeout: float = 60.0,
        session: requests.Session | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        base = base_url.rstrip("/")
        base = base.removesuffix("/v1")
        self.base_url = base
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.load_timeout = load_timeout
        self._api_key = api_key or None
        self.max_response_bytes = max_response_bytes
        self._session = session or requests.Session()
        self._owns_session = session is None

    def __repr__(self) -> str:
        auth = ", api_key=***" if self._api_key else ""
        return f"VLLMClient({self.base_url!r}{auth})"

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -------------------------------------------------------------

    def version(self) -> AttemptResult:
        """GET /version -> body {"version": "0.32.0"} (see `server_version`)."""
        return self._request("GET", "/version")

    def health(self) -> AttemptResult:
        """GET /health -> 200 with an empty body when the engine is up."""
        return self._request("GET", "/health")

    def list_models(self) -> AttemptResult:
        """GET /v1/models (see `model_cards`)."""
        return self._request("GET", "/v1/models")

    def metrics(self) -> AttemptResult:
        """GET /metrics: Prometheus text (serving.fact_readings.max_lora_from_metrics)."""
        return self._request("GET", "/metrics")

    def load_adapter(self, name: str, path: str, *, load_inplace: bool = False) -> AttemptResult:
        """POST /v1/load_lora_adapter. 200 body is plain text.

        `load_inplace` is only sent when True, so the call works on servers
        that predate the flag.
        """
        payload: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if load_inplace:
            payload["load_inplace"] = True
        return self._request(
            "POST",
            "/v1/load_lora_adapter",
            json_body=payload,
            timeout=self.load_timeout,
        )

    def unload_adapter(self, name: str) -> AttemptResult:
        """POST /v1/unload_lora_adapter. Unknown name -> 404 (`is_not_found_error`)."""
        return self._request(
            "POST",
            "/v1/unload_lora_adapter",
            json_body={"lora_name": name},
            timeout=self.load_timeout,
        )

    def complete_one_token(
        self, model: str, *, prompt: str = "Hello", chat: bool = True
    ) -> AttemptResult:
        """One greedy token through `model` (base served name or adapter name).

        chat=True uses /v1/chat/completions (needs a chat template on the
        model), chat=False uses /v1/completions.
        """
        if chat:
            path = "/v1/chat/completions"
            payload: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]}
        else:
            path = "/v1/completions"
            payload = {"prompt": prompt}
        payload.update({"model": model, "max_tokens": 1, "temperature": 0})
        return self._request("POST", path, json_body=payload)

    def probe(self, model: str, *, prompt: str, max_tokens: int) -> AttemptResult:
        """A greedy completion with the log-probability of each token: the same
        prompt through the same weights gives the same numbers (temperature 0),
        so outputs can be compared across replicas and against the base model."""
        payload = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 1,
        }
        return self._request("POST", "/v1/completions", json_body=payload)

    # -- plumbing ----------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> AttemptResult:
        url = self.base_url + path
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        read_timeout = timeout if timeout is not None else self.timeout
        try:
            response = self._session.request(
                method,
                url,
                json=json_body,
                headers=headers,
                timeout=(self.connect_timeout, read_timeout),
                stream=True,
            )
            try:
                text = _read_capped(
                    response, self.max_response_bytes, t0 + self.connect_timeout + read_timeout
                )
            finally:
                response.close()
        except ResponseTooLarge as exc:
            duration_ms = (time.perf_counter() - t0) * 1000
            logger.warning("vllm %s %s -> %s", method, url, exc)
            return AttemptResult(
                method=method,
                url=url,
                started_at=started_at,
                duration_ms=duration_ms,
                status_code=response.status_code,
                ok=False,
                error=str(exc),
                transient=False,
                body=None,
            )
        except requests.RequestException as exc:
            duration_ms = (time.perf_counter() - t0) * 1000
            transient = isinstance(
                exc,
                requests.ConnectionError
                | requests.Timeout
                | requests.exceptions.ChunkedEncodingError,
            )
            result = AttemptResult(
                method=method,
                url=url,
                started_at=started_at,
                duration_ms=duration_ms,
                status_code=None,
                ok=False,
                error=_describe_exception(exc),
                transient=transient,
                body=None,
            )
            logger.info("vllm %s %s -> %s (%.1f ms)", method, url, result.error, duration_ms)
            return result

        duration_ms = (time.perf_counter() - t0) * 1000
        body = _parse_body(text, response.headers.get("content-type", ""))
        ok = 200 <= response.status_code < 300
        result = AttemptResult(
            method=method,
            url=url,
            started_at=started_at,
            duration_ms=duration_ms,
            status_code=response.status_code,
            ok=ok,
            error="" if ok else extract_error(body, text) or f"HTTP {response.status_code}",
            transient=(not ok) and response.status_code in TRANSIENT_STATUS,
            body=body,
        )
        logger.debug("vllm %s %s -> %s (%.1f ms)", method, url, response.status_code, duration_ms)
        return result


def _describe_exception(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        kind = "timeout"
    elif isinstance(exc, requests.ConnectionError):
        kind = "connection error"
    else:
        kind = "request error"
    return f"{kind}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def fetch_metrics(
    base_url: str,
    *,
    api_key: str | None,
    timeout: float,
    max_bytes: int,
    session: requests.Session | None = None,
) -> tuple[AttemptResult, str | None]:
    """GET <base_url>/metrics: one attempt, the body (None on failure). The
    body is outside input: the whole exchange, headers to last byte, must end
    within `timeout` seconds, and more than `max_bytes` is refused."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    # Uncompressed: the byte cap then bounds what is parsed (no gzip bomb).
    headers = {"Accept": "text/plain", "Accept-Encoding": "identity"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    http = session or requests.Session()

    def result(status: int | None, ok: bool, error: str = "", transient: bool = False):
        return AttemptResult(
            method="GET",
            url=url,
            started_at=started_at,
            duration_ms=(time.perf_counter() - t0) * 1000,
            status_code=status,
            ok=ok,
            error=error,
            transient=transient,
            body="",
        )

    try:
        with http.get(url, headers=headers, timeout=(timeout, timeout), stream=True) as response:
            if response.status_code != 200:
                status = response.status_code
                return result(status, False, f"HTTP {status}", status in TRANSIENT_STATUS), None
            chunks, size = [], 0
            # read1 returns what has arrived: a trickling body meets the deadline check.
            while chunk := response.raw.read1(64 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    return result(200, False, f"body larger than {max_bytes} bytes"), None
                if time.perf_counter() - t0 > timeout:
                    return result(200, False, f"body not read within {timeout} s", True), None
                chunks.append(chunk)
    except requests.RequestException as error:
        return result(None, False, f"{type(error).__name__}: {error}"[:2000], True), None
    finally:
        if session is None:
            http.close()
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        return result(200, False, "body is not UTF-8"), None
    return result(200, True), text
