"""The one way the control plane talks to many replicas at once.

Rollouts, the reconcile (its polls, repairs and fingerprint probes) and
observability's /metrics reads all fan out through here:

- one pool of threads per process, shared by everything it runs: a pool per
  fan-out started 2 x N threads per rollout, which on a busy host cost more
  than the rollout's HTTP (100 promotions at once: bench/scale_promotions.py);
- each pool thread keeps its own HTTP session per replica (a session is never
  shared between threads), so keep-alive spares a connection and a session
  setup per replica and phase on every rollout and every tick;
- the work in the threads is HTTP only: the calling thread alone touches the
  database, and renews its claims (`tick`) while it waits;
- NO_RETRY, the policy of everything periodic: a dead replica is not waited
  out, the next tick tries again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

import requests
from django.conf import settings
from django.db import connections

from serving.attestation import require_not_quarantined
from serving.models import Deployment, Replica
from serving.replica_calls import ReplicaOutcome, RetryPolicy, reload_adapter, verify_serving
from serving.rules.probe import Probe, describe_distance
from serving.vllm_client import VLLMClient

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# The reconcile and the metrics reads never wait out a retry deadline on one
# replica: the next tick retries.
NO_RETRY = RetryPolicy(deadline_seconds=0, base_delay=0, max_delay=0)

POOL_THREADS = 64

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None
_thread_state = threading.local()


def replica_pool() -> ThreadPoolExecutor:
    """The process's pool of replica threads. Made after the fork (keyed by
    pid): a prefork child cannot use its parent's threads."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (
                os.getpid(),
                ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="replica"),
            )
        return _pool[1]


def replica_session(base_url: str) -> requests.Session:
    """The calling thread's own HTTP session for this replica, kept across calls."""
    sessions = getattr(_thread_state, "sessions", None)
    if sessions is None:
        sessions = _thread_state.sessions = {}
    if base_url not in sessions:
        session = requests.Session()
        # The environment's proxies and CA bundle for this replica, looked up
        # once: with trust_env, requests looks them up (and reads ~/.netrc) on
        # every call, a fair share of an in-sync tick's CPU at 32 replicas.
        session.proxies = requests.utils.get_environ_proxies(base_url)
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            session.verify = bundle
        session.trust_env = False
        sessions[base_url] = session
    return sessions[base_url]


def client_for(replica: Replica, deployment: Deployment, session=None) -> VLLMClient:
    """`session`: a requests.Session to reuse (the client then leaves it open).
    Raises RestoreQuarantined for a deployment quarantined after a restore: its replica URLs
    and its key came from a dump the audit chain does not vouch for yet."""
    require_not_quarantined(deployment)
    return VLLMClient(
        replica.base_url,
        session=session,
        api_key=deployment.vllm_api_key or None,
        timeout=settings.SERVING_HTTP_TIMEOUT_SECONDS,
        connect_timeout=settings.SERVING_CONNECT_TIMEOUT_SECONDS,
        load_timeout=settings.SERVING_LOAD_TIMEOUT_SECONDS,
    )


def fan_out(
    items: Sequence[T],
    work: Callable[[T], R],
    *,
    limit: int | None = None,
    tick: Callable[[], None] | None = None,
    interval: float = 1.0,
) -> list[R]:
    """`work(item)` for every item on the shared pool, at most `limit` at once;
    the results in the items' order. While it waits, `tick()` runs every
    `interval` seconds in the calling thread (claims renewed there). An
    exception from a work item or from `tick` is raised here, after which the
    items not yet started are not started."""
    pool = replica_pool()
    results: list = [None] * len(items)
    queue = list(enumerate(items))
    queue.reverse()
    limit = max(1, limit or len(items) or 1)
    pending: dict[Future, int] = {}

    def run(item):
        try:
            return work(item)
        finally:
            # The work touches no database; should that ever change, its
            # connection must not outlive the call.
            connections.close_all()

    while queue or pending:
        while queue and len(pending) < limit:
            index, item = queue.pop()
            pending[pool.submit(run, item)] = index
        done, _ = wait(pending, timeout=interval, return_when=FIRST_COMPLETED)
        for future in done:
            results[pending.pop(future)] = future.result()
        if tick is not None and pending:
            tick()
    return results


def on_replicas(
    deployment: Deployment,
    replicas: Sequence[Replica],
    work: Callable[[VLLMClient, Replica], R],
    *,
    limit: int | None = None,
    tick: Callable[[], None] | None = None,
    interval: float = 1.0,
) -> list[R]:
    """`work(client, replica)` on every replica at once, each through the pool
    thread's kept-alive session to that replica."""

    def run(replica: Replica) -> R:
        with client_for(replica, deployment, session=replica_session(replica.base_url)) as client:
            return work(client, replica)

    return fan_out(replicas, run, limit=limit, tick=tick, interval=interval)


def verify_with_fingerprint(
    client: VLLMClient,
    name: str,
    path: str,
    policy: RetryPolicy,
    *,
    deployment: Deployment,
    fingerprint: Probe | None = None,
    tolerance: float | None = None,
    compare_base: bool = True,
) -> ReplicaOutcome:
    """The proof that `name` serves the version's weights from `path`: listed
    there, answering a probe unlike the base model's (with the deployment's
    completion check), and, given the version's fingerprint, answering it
    within the tolerance. HTTP only; where the version has no fingerprint yet
    the caller records the outcome's probe as one (services.fingerprints).
    `compare_base=False` where the version's fingerprint on this deployment is
    known and will be matched: it was found unlike the base model when it was
    recorded, so matching it proves as much, without a base-model probe that
    vLLM 0.32's CPU backend can answer with the adapter's weights under traffic
    (docs/upstream/vllm-cpu-base-tokens-last-slot.md)."""

    def verify() -> ReplicaOutcome:
        return verify_serving(
            client,
            name,
            path,
            policy,
            with_completion=deployment.verify_with_completion,
            base_name=deployment.base_model_name if compare_base else "",
        )

    outcome = verify()
    if outcome.no_effect:
        outcome = _verify_again_after_reloads(client, name, path, policy, verify, outcome)
    if fingerprint is None or not outcome.ok or outcome.probe is None:
        return outcome
    tolerance = settings.SERVING_FINGERPRINT_TOLERANCE if tolerance is None else tolerance
    distance = fingerprint.distance(outcome.probe)
    if distance > tolerance:
        outcome.fingerprint_distance = distance
        outcome.fail(
            f"{name} serves other weights than this version's fingerprint: "
            f"{describe_distance(distance)}, above the tolerance {tolerance:g}."
        )
    return outcome


# How many times a "no effect" verdict is checked by loading the adapter again
# before it is believed: one verdict can be vLLM's, not the adapter's
# (docs/upstream/vllm-cpu-reload-no-effect.md); an inert adapter gives it every time.
NO_EFFECT_RELOADS = 2


def _verify_again_after_reloads(
    client: VLLMClient,
    name: str,
    path: str,
    policy: RetryPolicy,
    verify: Callable[[], ReplicaOutcome],
    first: ReplicaOutcome,
) -> ReplicaOutcome:
    """The probe through `name` answered exactly like the base model. Right
    after a reload under a running request, vLLM 0.32 on CPU has been seen to
    answer so for a good version (a swap rolled back in CI), so the verdict
    must hold over fresh loads: unload, load again (the replica's unload lane,
    old requests settled first) and verify again, NO_EFFECT_RELOADS times at
    most. Any clean verification wins; a version that truly has no effect
    answers like the base model after every load and is still refused, with
    what was seen said. The attempts of every round are kept on the outcome."""
    attempts = list(first.attempts)
    outcome = first
    for round_number in range(1, NO_EFFECT_RELOADS + 1):
        logger.info(
            "%s: %s answered like the base model; loading it again (%d of %d)",
            client.base_url,
            name,
            round_number,
            NO_EFFECT_RELOADS,
        )
        reloaded = reload_adapter(client, name, path, policy, ReplicaOutcome())
        attempts += reloaded.attempts
        if not reloaded.ok:
            reloaded.attempts = attempts
            return reloaded.fail(
                f"{name} answered exactly like the base model, and loading it again to "
                f"check failed: {reloaded.error}"
            )
        outcome = verify()
        attempts += outcome.attempts
        outcome.attempts = attempts
        if not outcome.no_effect:
            return outcome
    return outcome.fail(
        f"{name} has no effect: through it the probe gave exactly the base model's output "
        f"after each of {NO_EFFECT_RELOADS + 1} loads (the last {NO_EFFECT_RELOADS} an "
        "unload and a fresh load to rule out a stale load in vLLM): an untrained adapter, "
        "or weights that cancel out."
    )
