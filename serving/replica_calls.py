"""What the control plane does to ONE vLLM replica, over HTTP only.

These functions touch no database: rollouts run them in parallel threads and
record the returned attempts afterwards, so no row lock or connection is held
across an HTTP call. Their back-off sleeps go through the policy's `sleep`,
which the rollout makes interruptible: a cancelled rollout, or one whose claim
was lost, stops retrying at once instead of at the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from core.backoff import backoff_delay
from serving.fact_readings import lora_activity_from_metrics, lora_label_sets
from serving.lora_metrics import LoraSnapshot, MetricsParseError, parse_lora_metrics
from serving.rules.probe import PROBE_PROMPT, PROBE_TOKENS, Probe, has_no_effect
from serving.vllm_client import (
    AttemptResult,
    VLLMClient,
    fetch_metrics,
    is_already_loaded_error,
    is_not_found_error,
    model_cards,
    server_version,
    supports_load_inplace,
)

logger = logging.getLogger(__name__)


class RetryStopped(Exception):
    """Raised by a policy's sleep: stop retrying and report the last attempt."""


@dataclass(frozen=True)
class RetryPolicy:
    """Transient failures (refused, timeouts, 502/503) are retried with
    exponential backoff until the deadline; permanent ones are not."""

    deadline_seconds: float
    base_delay: float
    max_delay: float
    # How a back-off waits; may raise RetryStopped. Must not touch the database.
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        return cls(
            deadline_seconds=settings.SERVING_RETRY_DEADLINE_SECONDS,
            base_delay=settings.SERVING_RETRY_BASE_SECONDS,
            max_delay=settings.SERVING_RETRY_MAX_DELAY_SECONDS,
        )


@dataclass
class ReplicaOutcome:
    ok: bool = False
    error: str = ""
    vllm_version: str | None = None
    loaded_root: str | None = None
    probe: Probe | None = None
    # Set when the probe was compared with the version's fingerprint and was off it.
    fingerprint_distance: float | None = None
    # Set when the verification failed because the probe through the adapter
    # answered exactly like the base model's (verify_serving).
    no_effect: bool = False
    attempts: list[tuple[str, AttemptResult]] = field(default_factory=list)

    def fail(self, message: str) -> ReplicaOutcome:
        self.ok = False
        self.error = message
        return self

    def succeed(self) -> ReplicaOutcome:
        self.ok = True
        self.error = ""
        return self


# What a failed GET /metrics is stored as (observability tallies it by purpose).
METRICS_PURPOSE = "metrics"


@dataclass
class MetricsReading:
    """One replica's GET /metrics, read once a tick by the reconcile's observe
    step (serving.reconcile): the LoRA state it showed (None: the read failed,
    `outcome` says why), for the tick's facts and for observability."""

    outcome: ReplicaOutcome
    snapshot: LoraSnapshot | None
    # When the request was sent: a probe's mark counts until a read begun after it.
    started_at: datetime


def metrics_read(base_url: str, *, api_key: str | None, session) -> MetricsReading:
    """GET /metrics once (no retry: the next tick reads again), its body capped
    and its exchange bounded in time (OBSERVABILITY_VLLM_METRICS_*), parsed."""
    outcome = ReplicaOutcome()
    attempt, text = fetch_metrics(
        base_url,
        api_key=api_key,
        timeout=settings.OBSERVABILITY_VLLM_METRICS_TIMEOUT_SECONDS,
        max_bytes=settings.OBSERVABILITY_VLLM_METRICS_MAX_BYTES,
        session=session,
    )
    outcome.attempts.append((METRICS_PURPOSE, attempt))
    reading = MetricsReading(outcome, None, attempt.started_at)
    if text is None:
        outcome.fail(attempt.error)
        return reading
    try:
        reading.snapshot = parse_lora_metrics(text)
    except MetricsParseError as error:
        outcome.fail(str(error))
        return reading
    outcome.succeed()
    return reading


def call_with_retry(
    call: Callable[[], AttemptResult], purpose: str, outcome: ReplicaOutcome, policy: RetryPolicy
) -> AttemptResult:
    started = time.monotonic()
    retry = 0
    while True:
        result = call()
        outcome.attempts.append((purpose, result))
        if result.ok or not result.transient:
            return result
        delay = backoff_delay(retry, base=policy.base_delay, cap=policy.max_delay)
        if time.monotonic() - started + delay > policy.deadline_seconds:
            return result
        try:
            policy.sleep(delay)
        except RetryStopped:
            return result
        retry += 1


def _probe_call(client: VLLMClient, name: str, purpose: str, outcome, policy) -> AttemptResult:
    return call_with_retry(
        lambda: client.probe(name, prompt=PROBE_PROMPT, max_tokens=PROBE_TOKENS),
        purpose,
        outcome,
        policy,
    )


def probe_weights(
    client: VLLMClient, name: str, outcome: ReplicaOutcome, policy: RetryPolicy
) -> Probe | None:
    """The fixed probe through `name` (serving/rules/probe.py), or None if it did not answer."""
    answer = _probe_call(client, name, "fingerprint_check", outcome, policy)
    return Probe.from_body(answer.body) if answer.ok else None


def _describe(result: AttemptResult) -> str:
    code = result.status_code if result.status_code is not None else "no response"
    return f"{result.method} {result.url} -> {code}: {result.error or 'unexpected answer'}"


def _find(result: AttemptResult, name: str):
    return next((card for card in model_cards(result) if card.id == name), None)


def ensure_loaded(
    client: VLLMClient, name: str, path: str, policy: RetryPolicy, *, known_version: str = ""
) -> ReplicaOutcome:
    """Makes `name` serve from `path`. Already loaded there is success; loaded
    from another path is a swap (load_inplace on vLLM >= 0.33, else unload then load)."""
    outcome = ReplicaOutcome(vllm_version=known_version or None)
    if not outcome.vllm_version:
        answer = call_with_retry(client.version, "version", outcome, policy)
        if not answer.ok:
            return outcome.fail(_describe(answer))
        outcome.vllm_version = server_version(answer)
    # Requests of this name running where it is not loaded are a previous load's
    # (retired, or unloaded behind our back): loading now would batch them with the
    # new load's and kill vLLM 0.32 (settle_after_unload). A /metrics read tells
    # whether to wait, and a name it lists is looked up in /v1/models.
    ready, listing = _idle_or_loaded(client, name, outcome, policy)
    if not ready:
        return outcome.fail(
            f"requests through {name} from an earlier load were still running after "
            f"{settings.SERVING_UNLOAD_SETTLE_SECONDS:g} s (SERVING_UNLOAD_SETTLE_SECONDS); "
            "not loaded while they run."
        )
    if listing is None:
        # Load first: the common case (a new adapter) costs one call. Only a name
        # that is already loaded needs a look at /v1/models, to tell "done" from "swap".
        loaded = call_with_retry(lambda: client.load_adapter(name, path), "load", outcome, policy)
        if loaded.ok:
            outcome.loaded_root = path
            return outcome.succeed()
        if not is_already_loaded_error(loaded):
            return outcome.fail(_describe(loaded))
        listing = call_with_retry(client.list_models, "list_models", outcome, policy)
        if not listing.ok:
            return outcome.fail(_describe(listing))
    card = _find(listing, name)
    if card is not None and card.root == path:
        outcome.loaded_root = path
        return outcome.succeed()
    return _swap(client, name, path, policy, outcome)


class _UnloadLane:
    """One replica's unloads, one at a time and paced: a rollout's swap, a
    reconcile's repair and a retire of the same replica in this process wait for
    each other here, whatever path they came by."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last = 0.0


_lanes_lock = threading.Lock()
_lanes: dict[str, _UnloadLane] = {}


@contextmanager
def unload_lane(base_url: str, policy: RetryPolicy) -> Iterator[None]:
    """Held while an adapter is unloaded from the replica at `base_url` (and,
    for a reload, until it is loaded again). Waits SERVING_UNLOAD_PACE_SECONDS
    after the replica's previous unload, through the policy's sleep (so a
    cancelled rollout stops waiting)."""
    with _lanes_lock:
        lane = _lanes.setdefault(base_url, _UnloadLane())
    with lane.lock:
        gap = settings.SERVING_UNLOAD_PACE_SECONDS - (time.monotonic() - lane.last)
        if gap > 0:
            # A stopped rollout's sleep raises at once; the unload itself is quick.
            with suppress(RetryStopped):
                policy.sleep(gap)
        try:
            yield
        finally:
            lane.last = time.monotonic()


# Requests that vLLM's API server resolved to the old load just before the
# unload reach the engine (and its metrics) a moment later.
UNLOAD_GRACE_SECONDS = 0.25
# vLLM records its LoRA metrics after every engine step, and once more, without
# the finished requests, after the last; no new record for this long, while the
# last one shows the name idle, means nothing of it is running.
ENGINE_IDLE_SECONDS = 0.5


def settle_after_unload(
    client: VLLMClient, name: str, outcome: ReplicaOutcome, policy: RetryPolicy
) -> bool:
    """After unloading `name`, waits until vLLM shows no request of that name
    running or waiting; True when none is, or when /metrics cannot tell.

    Why: vLLM 0.32 gives every load a new LoRA id, and its batch keeps one
    LoRARequest per NAME (LoRARequest compares by lora_name). A request still
    running under the old id, batched with one under the new id, leaves one id
    without a slot, and the engine dies (KeyError in convert_mapping, then
    EngineDeadError; docs/upstream/vllm-unload-keyerror.md). Once unloaded, the
    name answers 404 to new requests, so the old ones only finish.

    vLLM's metrics are as of its last engine step, so "idle" counts only from a
    record made after the first read (or when no step has run for
    ENGINE_IDLE_SECONDS and the record shows the name idle): a request admitted
    during the step in progress is not in the record before it (seen on real
    vLLM: the engine died after one read)."""
    deadline = time.monotonic() + settings.SERVING_UNLOAD_SETTLE_SECONDS
    try:
        policy.sleep(UNLOAD_GRACE_SECONDS)
    except RetryStopped:
        return False
    first: float | None = None
    first_read = time.monotonic()
    delay = 0.05
    while True:
        read = client.metrics()
        outcome.attempts.append(("unload_settle", read))
        activity = lora_activity_from_metrics(read)
        if activity is None:
            return True
        recorded, busy = activity
        if first is None:
            first = recorded
        if recorded > first and name not in busy:
            return True
        if (
            recorded == first
            and name not in busy
            and time.monotonic() - first_read >= ENGINE_IDLE_SECONDS
        ):
            # No engine step since the first read, and the last record shows
            # the name idle: nothing of it runs. Where that record still lists
            # the name, no new record only means no step ran: an engine
            # starved of CPU, not an idle one (vLLM writes a record without
            # the name after a request's last step). Taking that for idle
            # loaded the new version under the old load's request, and the
            # verification's base-model probes, batched with it, answered
            # through the last LoRA slot: a good version found to have "no
            # effect" and rolled back (docs/upstream/vllm-cpu-reload-no-effect.md).
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            policy.sleep(min(delay, remaining))
        except RetryStopped:
            return False
        delay = min(delay * 2, 0.5)


def _idle_or_loaded(
    client: VLLMClient, name: str, outcome: ReplicaOutcome, policy
) -> tuple[bool, AttemptResult | None]:
    """(ready, listing): ready when `name` is loaded (its requests are then the
    current load's), or when vLLM's metrics never listed a request of it since
    the replica started, or once it settled as after an unload. `listing` is
    the /v1/models answer that shows `name` loaded, so the caller need not ask
    again; None when it was not read or `name` is not in it.

    One read that shows `name` idle is not enough where it was requested
    before: requests admitted just before an unload made outside the product
    reach the engine's record a step later (UNLOAD_GRACE_SECONDS), as
    settle_after_unload waits for. A name no series ever listed (a new
    adapter, a restarted replica) loads at once, without the wait."""
    read = client.metrics()
    outcome.attempts.append(("unload_settle", read))
    label_sets = lora_label_sets(read)
    if label_sets is None or not any(
        name in running or name in waiting for running, waiting in label_sets
    ):
        return True, None
    listing = call_with_retry(client.list_models, "list_models", outcome, policy)
    if listing.ok and _find(listing, name) is not None:
        return True, listing
    return settle_after_unload(client, name, outcome, policy), None


def reload_adapter(
    client: VLLMClient, name: str, path: str, policy: RetryPolicy, outcome: ReplicaOutcome
) -> ReplicaOutcome:
    """Unload then load `name` (vLLM <= 0.32's swap, and a repair's reload), in
    the replica's unload lane, with the old id's requests finished in between."""
    with unload_lane(client.base_url, policy):
        unloaded = call_with_retry(lambda: client.unload_adapter(name), "unload", outcome, policy)
        if not (unloaded.ok or is_not_found_error(unloaded)):
            return outcome.fail(_describe(unloaded))
        if not settle_after_unload(client, name, outcome, policy):
            return outcome.fail(
                f"{name} was unloaded, but requests through it were still running after "
                f"{settings.SERVING_UNLOAD_SETTLE_SECONDS:g} s (SERVING_UNLOAD_SETTLE_SECONDS); "
                "not loaded again while they run: vLLM 0.32's engine dies when the old and "
                "the new load of one name are batched together."
            )
        loaded = call_with_retry(lambda: client.load_adapter(name, path), "load", outcome, policy)
        if not loaded.ok:
            return outcome.fail(_describe(loaded))
    outcome.loaded_root = path
    return outcome.succeed()


def _swap(client, name, path, policy, outcome: ReplicaOutcome) -> ReplicaOutcome:
    if supports_load_inplace(outcome.vllm_version):
        # Validates the new weights before switching, so a failure leaves the old serving.
        swapped = call_with_retry(
            lambda: client.load_adapter(name, path, load_inplace=True),
            "load_inplace",
            outcome,
            policy,
        )
        if not swapped.ok:
            return outcome.fail(_describe(swapped))
    else:
        # vLLM <= 0.32: load_inplace sticks and re-reads from disk every step (#33791).
        return reload_adapter(client, name, path, policy, outcome)
    outcome.loaded_root = path
    return outcome.succeed()


def ensure_unloaded(client: VLLMClient, name: str, policy: RetryPolicy) -> ReplicaOutcome:
    outcome = ReplicaOutcome()
    with unload_lane(client.base_url, policy):
        result = call_with_retry(lambda: client.unload_adapter(name), "unload", outcome, policy)
    if result.ok or is_not_found_error(result):
        return outcome.succeed()
    return outcome.fail(_describe(result))


BASE_RECHECKS = 6


def _base_was_contaminated(
    client: VLLMClient, base_name: str, adapter: Probe, outcome: ReplicaOutcome, policy
) -> bool:
    """The base model's probe equalled the adapter's: was that the base model?

    On vLLM 0.32's CPU backend, base-model tokens batched with adapter requests
    go through the LAST LoRA slot's weights (their index -1 picks the last row
    of the stacked weights; docs/upstream/vllm-cpu-base-tokens-last-slot.md).
    Right after its own probe the adapter often sits in that slot, so under
    traffic the base answer can be the adapter's answer exactly; the adapter's
    own answers are right. So the base model is asked again. It was
    contaminated when two fresh answers agree with each other and differ from
    the adapter's, or when no fresh answer equals the adapter's (an inert
    adapter answers exactly like the base model, so the base model, asked six
    times, would have answered like it again). Under traffic that contaminates
    every base answer, an inert adapter can pass here; on GPUs, and on a quiet
    CPU replica, base answers are the base model's."""
    seen: list[Probe] = []
    like_adapter = asked = 0
    for _ in range(BASE_RECHECKS):
        asked += 1
        answer = _probe_call(client, base_name, "verify_base", outcome, policy)
        probe = Probe.from_body(answer.body) if answer.ok else None
        if probe is None:
            continue
        if has_no_effect(adapter, probe):
            like_adapter += 1
        elif any(has_no_effect(probe, p) for p in seen):
            break
        seen.append(probe)
    else:
        if like_adapter or not seen:
            return False
    logger.info(
        "%s: the base model answered like the adapter, then %d of %d times again",
        client.base_url,
        like_adapter,
        asked,
    )
    return True


def verify_serving(
    client: VLLMClient,
    name: str,
    path: str,
    policy: RetryPolicy,
    *,
    with_completion: bool,
    base_name: str = "",
) -> ReplicaOutcome:
    """`GET /v1/models` lists `name` with root == path; then, with_completion,
    a greedy probe through the adapter answers, and (given the base model's
    served name) differs from the same probe through the base model: an adapter
    whose output equals the base model's has no effect (serving/rules/probe.py).
    The adapter's probe is kept on the outcome for the version's fingerprint."""
    outcome = ReplicaOutcome()
    listing = call_with_retry(client.list_models, "verify_models", outcome, policy)
    if not listing.ok:
        return outcome.fail(_describe(listing))
    card = _find(listing, name)
    if card is None:
        return outcome.fail(f"{name} is not listed by /v1/models after loading.")
    outcome.loaded_root = card.root
    if card.root != path:
        return outcome.fail(f"{name} serves from {card.root}, expected {path}.")
    if not with_completion:
        return outcome.succeed()
    answer = _probe_call(client, name, "verify_completion", outcome, policy)
    if not answer.ok:
        return outcome.fail(_describe(answer))
    outcome.probe = Probe.from_body(answer.body)
    if outcome.probe is None:
        return outcome.fail(f"{name} answered a completion without logprobs.")
    if base_name:
        base = _probe_call(client, base_name, "verify_base", outcome, policy)
        if not base.ok:
            return outcome.fail(_describe(base))
        base_probe = Probe.from_body(base.body)
        if (
            base_probe is not None
            and has_no_effect(outcome.probe, base_probe)
            and not _base_was_contaminated(client, base_name, outcome.probe, outcome, policy)
        ):
            outcome.no_effect = True
            return outcome.fail(
                f"{name} has no effect: through it the probe gives exactly the base model's "
                "output (an untrained adapter, or weights that cancel out)."
            )
    return outcome.succeed()
