"""Reading a vLLM replica's /metrics for observability: the bounded fetch,
and which of the LoRA label sets (parsed in serving.lora_metrics) are
clients' activity and demand.

The body is outside input: it is read with a byte cap and a total deadline,
and parsed where serving parses it. No Django here; the caller records the
attempt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

import requests

from serving.lora_metrics import LoraSeries
from serving.probe import OwnRequests
from serving.vllm_client import TRANSIENT_STATUS, AttemptResult


def clients_only(
    series: tuple[LoraSeries, ...],
    own: OwnRequests | None,
    after: float | None,
    marked: Mapping[str, float] | None = None,
) -> tuple[LoraSeries, ...]:
    """The label sets among `series` (those current since `after`) that show
    clients' requests, given what the control plane itself just asked that
    replica (serving.probe.OwnRequests). A set of probed adapters only is the
    probes' if the read just before them did not show it as current since
    `after`; if it did, a client was there first: it is kept, with the stamp
    that read saw. A client's request for a probed adapter while the probes
    ran is missed (the same series). Idle and mixed sets stay as they are.

    `marked`: adapters the control plane probed there, wherever from
    (serving.services.own_probes), each with the latest time its probes can
    have been current (the last probe plus the grace). A set stamped by then,
    listing marked adapters and none but probed ones, is the probes'."""
    if marked:
        probed = own.names if own is not None else frozenset()
        kept = []
        for s in series:
            listed = {*s.running, *s.waiting}
            mine = {name for name in listed if marked.get(name, -1.0) >= s.timestamp}
            if not mine or not listed <= probed | mine:
                kept.append(s)
        series = tuple(kept)
    if own is None or own.before is None or not own.names:
        return series
    kept = []
    for s in series:
        listed = {*s.running, *s.waiting}
        if not listed or not listed <= own.names:
            kept.append(s)
            continue
        stamp = own.before.get((s.running, s.waiting))
        if stamp is not None and (after is None or stamp > after):
            kept.append(LoraSeries(s.running, s.waiting, stamp))
    return tuple(kept)


def demand_units(series: tuple[LoraSeries, ...]) -> dict[str, int]:
    """Per adapter, what placement counts as its demand on one replica over
    these label sets: 1 if one listed it running, 1 more if one listed it
    waiting (vLLM 0.32 lists names, not request counts)."""
    units: dict[str, int] = {}
    running = {name for s in series for name in s.running}
    waiting = {name for s in series for name in s.waiting}
    for name in running | waiting:
        units[name] = (name in running) + (name in waiting)
    return units


def fetch_metrics(
    base_url: str,
    *,
    api_key: str | None,
    timeout: float,
    max_bytes: int,
    session: requests.Session | None = None,
) -> tuple[AttemptResult, str | None]:
    """GET <base_url>/metrics: one attempt, the body (None on failure). The
    whole exchange, headers to last byte, must end within `timeout` seconds."""
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
