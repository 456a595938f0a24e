"""A canary's health gates: pure functions, no database, no door.

The inputs are the front door's per-server counters in the adapter's backend
(HAProxy's `show stat`): the canary server runs the new version, the others the
old one. Counters are cumulative since the door's worker started, and a
reload starts them again at zero; `advance` folds such resets in, so that the
totals since the bake began survive them (the state is a plain dict, kept in
the rollout's row).

The verdict, `judge`:
- errors: the canary's error rate may exceed the old version's by at most
  `max_error_rate_increase` (absolute); judged as soon as the canary has
  `min_requests`, so a broken version is pulled out early;
- latency: the canary's mean response time may be at most `max_latency_ratio`
  times the old version's plus `latency_slack_ms` (a few milliseconds of
  difference on tiny numbers means nothing); judged when the bake is over;
- fewer than `min_requests` to the canary when the bake is over: not proven,
  and a canary that is not proven is not promoted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

PASS = "pass"  # noqa: S105 (a verdict, not a password)
FAIL = "fail"
WAIT = "wait"

# HAProxy's server weights go from 0 to 256; a share is rendered in hundredths.
WEIGHT_SCALE = 100


@dataclass(frozen=True)
class Thresholds:
    min_requests: int
    max_error_rate_increase: float
    max_latency_ratio: float
    latency_slack_ms: float = 50.0


@dataclass(frozen=True)
class ServerSample:
    """One server's cumulative counters in one backend, as read now."""

    requests: int
    errors: int
    # HAProxy's `rtime`: the mean response time of the server's last 1024
    # requests (ms), not a cumulative figure: it is read, not differenced.
    latency_ms: float


@dataclass(frozen=True)
class Side:
    requests: int
    errors: int
    latency_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Gate:
    name: str
    verdict: str
    canary: float | None
    baseline: float | None
    limit: float | None
    message: str


@dataclass(frozen=True)
class Verdict:
    outcome: str  # PASS, FAIL or WAIT
    reason: str
    gates: tuple[Gate, ...]

    def as_dict(self) -> dict:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "gates": [asdict(g) for g in self.gates],
        }


def split_weights(share: int, canary: str, others: list[str]) -> dict[str, int]:
    """Server weights that send `share` percent of the requests to `canary`
    and the rest evenly to `others` (weighted round robin)."""
    if not 1 <= share <= 99:
        raise ValueError(f"a canary's share is 1 to 99 percent, not {share}")
    if not others:
        raise ValueError("a split needs a server beside the canary")
    weights = {canary: share}
    rest = (WEIGHT_SCALE - share) / len(others)
    for server in others:
        weights[server] = max(1, round(rest))
    return weights


def start(samples: Mapping[str, ServerSample], epoch: str) -> dict:
    """The state at the start of a bake: what the counters read now."""
    now = {server: [s.requests, s.errors] for server, s in samples.items()}
    return {"epoch": epoch, "base": now, "last": now, "carried": {}}


def advance(state: dict, samples: Mapping[str, ServerSample], epoch: str) -> dict:
    """The state after reading `samples`. `epoch` names the door worker that
    counted them (its pid): a new one started from zero, so what the old one
    had counted since the base is carried over."""
    carried = {k: list(v) for k, v in state.get("carried", {}).items()}
    base = state["base"]
    if epoch != state["epoch"]:
        for server, last in state["last"].items():
            was = base.get(server, [0, 0])
            have = carried.setdefault(server, [0, 0])
            have[0] += max(0, last[0] - was[0])
            have[1] += max(0, last[1] - was[1])
        base = {}
    now = {server: [s.requests, s.errors] for server, s in samples.items()}
    return {"epoch": epoch, "base": base, "last": now, "carried": carried}


def totals(state: dict) -> dict[str, tuple[int, int]]:
    """(requests, errors) per server since the bake began."""
    out = {}
    for server in set(state["last"]) | set(state.get("carried", {})):
        last = state["last"].get(server, [0, 0])
        base = state["base"].get(server, [0, 0])
        carried = state.get("carried", {}).get(server, [0, 0])
        out[server] = (
            carried[0] + max(0, last[0] - base[0]),
            carried[1] + max(0, last[1] - base[1]),
        )
    return out


def sides(state: dict, samples: Mapping[str, ServerSample], canary: str) -> tuple[Side, Side]:
    """The canary's side and the old version's (every other server, pooled)."""
    counted = totals(state)
    requests, errors = counted.get(canary, (0, 0))
    canary_latency = samples[canary].latency_ms if canary in samples and requests else None
    old = [server for server in counted if server != canary]
    old_requests = sum(counted[s][0] for s in old)
    old_errors = sum(counted[s][1] for s in old)
    weighted = [(counted[s][0], samples[s].latency_ms) for s in old if s in samples]
    weight = sum(n for n, _ in weighted)
    old_latency = sum(n * ms for n, ms in weighted) / weight if weight else None
    return Side(requests, errors, canary_latency), Side(old_requests, old_errors, old_latency)


def judge(canary: Side, baseline: Side, limits: Thresholds, *, bake_over: bool) -> Verdict:
    enough = canary.requests >= limits.min_requests
    allowed = baseline.error_rate + limits.max_error_rate_increase
    if not enough:
        errors = Gate(
            "errors",
            WAIT,
            canary.error_rate if canary.requests else None,
            baseline.error_rate if baseline.requests else None,
            allowed,
            f"{canary.requests} of the {limits.min_requests} requests needed to judge",
        )
    elif canary.error_rate > allowed:
        errors = Gate(
            "errors",
            FAIL,
            canary.error_rate,
            baseline.error_rate,
            allowed,
            f"error rate {canary.error_rate:.1%} ({canary.errors} of {canary.requests}) "
            f"against {baseline.error_rate:.1%} on the old version; at most {allowed:.1%}",
        )
    else:
        errors = Gate(
            "errors",
            PASS,
            canary.error_rate,
            baseline.error_rate,
            allowed,
            f"error rate {canary.error_rate:.1%} against {baseline.error_rate:.1%}",
        )
    latency = _latency_gate(canary, baseline, limits, enough=enough, bake_over=bake_over)
    gates = (errors, latency)
    failed = [g for g in gates if g.verdict == FAIL]
    if failed:
        return Verdict(FAIL, "; ".join(f"{g.name}: {g.message}" for g in failed), gates)
    if not bake_over:
        return Verdict(WAIT, "baking", gates)
    if not enough:
        return Verdict(
            FAIL,
            f"not proven: the canary had {canary.requests} requests in its bake time, "
            f"{limits.min_requests} are needed to judge it",
            gates,
        )
    return Verdict(PASS, "; ".join(f"{g.name}: {g.message}" for g in gates), gates)


def _latency_gate(
    canary: Side, baseline: Side, limits: Thresholds, *, enough: bool, bake_over: bool
) -> Gate:
    if canary.latency_ms is None or not enough:
        return Gate("latency", WAIT, canary.latency_ms, baseline.latency_ms, None, "not judged yet")
    if baseline.latency_ms is None:
        # Nothing to compare with: the old version had no requests.
        return Gate("latency", PASS, canary.latency_ms, None, None, "no old version to compare")
    limit = baseline.latency_ms * limits.max_latency_ratio + limits.latency_slack_ms
    message = f"{canary.latency_ms:.0f} ms against {baseline.latency_ms:.0f} ms"
    if not bake_over:
        return Gate("latency", WAIT, canary.latency_ms, baseline.latency_ms, limit, message)
    if canary.latency_ms > limit:
        return Gate(
            "latency",
            FAIL,
            canary.latency_ms,
            baseline.latency_ms,
            limit,
            f"{message}; at most {limit:.0f} ms",
        )
    return Gate("latency", PASS, canary.latency_ms, baseline.latency_ms, limit, message)
