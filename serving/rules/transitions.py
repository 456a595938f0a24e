"""The serving state machines, each one explicit table.

Re-entering the current state is allowed everywhere, so a redelivered task
(acks_late) can resume a rollout from where the previous worker stopped.
"""

from __future__ import annotations

from serving.models import CanaryState as C
from serving.models import GrantStatus as G
from serving.models import PromotionStatus as P
from serving.models import ReplicaStepStatus as R
from serving.models import RolloutStatus as S

ROLLOUT_TRANSITIONS: dict[str, frozenset[str]] = {
    # Every unfinished state may be cancelled by a person (serving.services.rollout_requests).
    S.PENDING: frozenset({S.STAGING, S.LOADING, S.FAILED, S.CANCELLED}),
    S.STAGING: frozenset({S.LOADING, S.FAILED, S.CANCELLED}),
    # loading <-> verifying: a canary is loaded and verified, then the rest.
    S.LOADING: frozenset({S.VERIFYING, S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.CANCELLED}),
    S.VERIFYING: frozenset(
        {S.LOADING, S.BAKING, S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.CANCELLED}
    ),
    # A traffic canary bakes after its replica is verified; then either the
    # others are swapped (loading), or the canary is rolled back. A resumed
    # worker goes through loading and verifying again (idempotent) before it
    # bakes on.
    S.BAKING: frozenset({S.LOADING, S.FAILED, S.ROLLED_BACK, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.ROLLED_BACK: frozenset(),
    S.CANCELLED: frozenset(),
}
ROLLOUT_TERMINAL = frozenset(s for s, nxt in ROLLOUT_TRANSITIONS.items() if not nxt)

REPLICA_STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PENDING: frozenset({R.DEFERRED, R.LOADING, R.FAILED, R.ROLLED_BACK, R.CANCELLED}),
    # The reconcile completes a deferred step once the replica is back and verified.
    R.DEFERRED: frozenset({R.SUCCEEDED, R.CANCELLED}),
    R.LOADING: frozenset({R.VERIFYING, R.SUCCEEDED, R.FAILED, R.ROLLED_BACK, R.CANCELLED}),
    R.VERIFYING: frozenset({R.SUCCEEDED, R.FAILED, R.ROLLED_BACK, R.CANCELLED}),
    R.SUCCEEDED: frozenset({R.ROLLED_BACK}),
    R.FAILED: frozenset({R.ROLLED_BACK}),
    R.ROLLED_BACK: frozenset(),
    R.CANCELLED: frozenset(),
}
REPLICA_STEP_UNFINISHED = frozenset({R.PENDING, R.LOADING, R.VERIFYING, R.DEFERRED})

PROMOTION_TRANSITIONS: dict[str, frozenset[str]] = {
    P.PENDING_APPROVAL: frozenset({P.APPROVED, P.REJECTED, P.CANCELLED}),
    P.APPROVED: frozenset(),
    P.REJECTED: frozenset(),
    P.CANCELLED: frozenset(),
}

# A grant to call another department's adapter (serving/services/grants.py). A
# request nobody decided before its end date expires too.
GRANT_TRANSITIONS: dict[str, frozenset[str]] = {
    G.REQUESTED: frozenset({G.APPROVED, G.REFUSED, G.EXPIRED}),
    G.APPROVED: frozenset({G.REVOKED, G.EXPIRED}),
    G.REFUSED: frozenset(),
    G.REVOKED: frozenset(),
    G.EXPIRED: frozenset(),
}
GRANT_LIVE = frozenset(s for s, nxt in GRANT_TRANSITIONS.items() if nxt)

# A canary's decision (serving.models.Canary). The gates decide a baking canary
# unless a person asked first; the worker carries out a person's decision. Each
# move is a compare-and-swap on the state read (core.state.move), so a person's
# request and the gates' verdict in the same second cannot both win.
CANARY_TRANSITIONS: dict[str, frozenset[str]] = {
    # Verified on its replica: a traffic canary bakes, a canary without a share
    # has passed (its verification was the test). Ended: its rollout stopped first.
    C.WAITING: frozenset({C.BAKING, C.PASSED, C.ENDED}),
    C.BAKING: frozenset({C.PASSED, C.FAILED, C.PROMOTE_ASKED, C.ABORT_ASKED, C.ENDED}),
    C.PROMOTE_ASKED: frozenset({C.PROMOTED, C.ENDED}),
    C.ABORT_ASKED: frozenset({C.ABORTED, C.ENDED}),
    C.PASSED: frozenset(),
    C.FAILED: frozenset(),
    C.PROMOTED: frozenset(),
    C.ABORTED: frozenset(),
    C.ENDED: frozenset(),
}
CANARY_UNDECIDED = frozenset({C.WAITING, C.BAKING, C.PROMOTE_ASKED, C.ABORT_ASKED})
