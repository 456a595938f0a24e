from __future__ import annotations

from collections.abc import Sequence

from serving.models import HttpAttempt, Replica, ReplicaRollout
from serving.replica_calls import ReplicaOutcome


def attempts_record(
    replica: Replica, outcome: ReplicaOutcome, replica_rollout: ReplicaRollout | None = None
) -> None:
    attempts_record_all([(replica, outcome, replica_rollout)])


def attempts_record_all(
    rows: Sequence[tuple[Replica, ReplicaOutcome, ReplicaRollout | None]],
) -> None:
    """Every attempt of several replicas in one INSERT."""
    HttpAttempt.objects.bulk_create(
        [
            HttpAttempt(
                replica=replica,
                replica_rollout=replica_rollout,
                purpose=purpose,
                method=result.method,
                url=result.url[:1000],
                started_at=result.started_at,
                duration_ms=result.duration_ms,
                status_code=result.status_code,
                ok=result.ok,
                transient=result.transient,
                error=result.error[:4000],
            )
            for replica, outcome, replica_rollout in rows
            for purpose, result in outcome.attempts
        ]
    )
