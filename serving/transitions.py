"""The serving state machines, each one explicit table.

Re-entering the current state is allowed everywhere, so a redelivered task
(acks_late) can resume a rollout from where the previous worker stopped.
"""

from __future__ import annotations

from serving.models import PromotionStatus as P
from serving.models import ReplicaStepStatus as R
from serving.models import RolloutStatus as S

ROLLOUT_TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.STAGING, S.LOADING, S.FAILED}),
    S.STAGING: frozenset({S.LOADING, S.FAILED}),
    # loading <-> verifying: a canary is loaded and verified, then the rest.
    S.LOADING: frozenset({S.VERIFYING, S.SUCCEEDED, S.FAILED, S.ROLLED_BACK}),
    S.VERIFYING: frozenset({S.LOADING, S.SUCCEEDED, S.FAILED, S.ROLLED_BACK}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.ROLLED_BACK: frozenset(),
}
ROLLOUT_TERMINAL = frozenset(s for s, nxt in ROLLOUT_TRANSITIONS.items() if not nxt)

REPLICA_STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PENDING: frozenset({R.LOADING, R.FAILED, R.ROLLED_BACK}),
    R.LOADING: frozenset({R.VERIFYING, R.SUCCEEDED, R.FAILED, R.ROLLED_BACK}),
    R.VERIFYING: frozenset({R.SUCCEEDED, R.FAILED, R.ROLLED_BACK}),
    R.SUCCEEDED: frozenset({R.ROLLED_BACK}),
    R.FAILED: frozenset({R.ROLLED_BACK}),
    R.ROLLED_BACK: frozenset(),
}

PROMOTION_TRANSITIONS: dict[str, frozenset[str]] = {
    P.PENDING_APPROVAL: frozenset({P.APPROVED, P.REJECTED, P.CANCELLED}),
    P.APPROVED: frozenset(),
    P.REJECTED: frozenset(),
    P.CANCELLED: frozenset(),
}
