"""Tokens vLLM counted that no span reported: a stream the client aborted.

vLLM exports a request's `llm_request` span only when the request finishes; one
the client aborts (it closes the stream) exports none, yet its prompt was read
and its tokens generated. Each replica's own counters (`vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`, read from /metrics once a tick by the reconcile)
count them all. So at each reading T the deployment's counters C(T), summed
over its replicas since a baseline, are compared with the tokens of the spans
of requests that STARTED before T, S(<T), once every such span has had time to
arrive (SETTLE_AFTER_SECONDS later):

    D(T) = C(T) - S(<T)

A request that finished with a span adds as much to S as to C, or more (what it
generated after T is in S, not in C(T)); an aborted one adds only to C. So D(T)
never exceeds the tokens of requests that were aborted by T, and is exact at a
moment with nothing in flight. The deployment's unattributed tokens are the
largest D seen: each settlement charges what D grew past that. Who aborted is
not in the counters (they carry the base model's name only), so nothing is
charged to a key or department: the tokens are the deployment's, shown apart
on the usage page and in its cost. docs/operators/usage.md, "Aborted streams".

A span that arrives after its window was settled (a request longer than the
delay) is counted late by the receiver (observability.tokens) and taken off at
the next settlement. The baseline is taken at a reading with nothing in flight
on any replica, so no request straddles it; a replica's first reading is its
own baseline, and a counter lower than before (a restart) counts from zero.

Runs under the reconcile's claim (serving.reconcile.tick), after its one read
of /metrics; the settlement locks the deployment's MeteringState row, as the
receiver does, so that a span is either in a settled window or late.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from observability.models import MeteredRequest, MeteringState, UnattributedTokens
from observability.usage import counter_increase
from serving.models import Deployment, Replica
from serving.replica_calls import MetricsReading

logger = logging.getLogger(__name__)

# Every span of a request that started before a reading has arrived this long
# after it (vLLM sends a span within a second of the request's end, and retries
# for a minute): longer than the longest request a deployment serves, with margin.
SETTLE_AFTER_SECONDS = 600
# Readings kept to settle: one per this many seconds (at most about 20 waiting).
SAMPLE_EVERY_SECONDS = 30


def unmetered_tokens_reconcile(
    deployment: Deployment,
    replicas: list[Replica],
    readings: Mapping[int, MetricsReading],
    *,
    now: datetime | None = None,
) -> tuple[int, int]:
    """Adds this tick's counter readings and settles those old enough; returns
    the (prompt, completion) tokens newly charged as unattributed."""
    now = now or timezone.now()
    snapshots = {
        replica.pk: reading.snapshot
        for replica in replicas
        if (reading := readings.get(replica.pk)) is not None
        and reading.snapshot is not None
        and reading.snapshot.prompt_tokens_total is not None
        and reading.snapshot.generation_tokens_total is not None
    }
    if not snapshots:
        return 0, 0
    state, _ = MeteringState.objects.get_or_create(deployment=deployment)
    counters = dict(state.counters or {})
    grown = [0, 0]
    for pk, snapshot in snapshots.items():
        prompt, generation = snapshot.prompt_tokens_total, snapshot.generation_tokens_total
        assert prompt is not None and generation is not None  # the filter above
        current = [prompt, generation]
        before = counters.get(str(pk))
        if before is not None:  # else the replica's first reading: its baseline
            grown[0] += counter_increase(before[0], current[0])
            grown[1] += counter_increase(before[1], current[1])
        counters[str(pk)] = current
    counted = (state.counted_prompt + grown[0], state.counted_completion + grown[1])
    fields = {
        "counters": counters,
        "counted_prompt": counted[0],
        "counted_completion": counted[1],
    }
    if any(grown):
        fields["counted_at"] = now
    if state.settled_at is None:
        quiet = len(snapshots) == len(replicas) and all(
            s.requests_in_flight == 0 for s in snapshots.values()
        )
        if quiet:
            fields.update(
                settled_at=now,
                settled_prompt=counted[0],
                settled_completion=counted[1],
                pending=[],
            )
        MeteringState.objects.filter(pk=state.pk).update(**fields)
        return 0, 0
    pending = [list(p) for p in state.pending or []]
    stamp = now.timestamp()
    sampled = not pending or stamp - pending[-1][0] >= SAMPLE_EVERY_SECONDS
    if sampled:
        pending.append([stamp, counted[0], counted[1]])
    due = [p for p in pending if p[0] <= stamp - SETTLE_AFTER_SECONDS]
    fields["pending"] = pending[len(due) :]
    if not due:
        # An idle tick between samples (counters as they were) writes nothing.
        if sampled or any(grown) or counters != (state.counters or {}):
            MeteringState.objects.filter(pk=state.pk).update(**fields)
        return 0, 0
    with transaction.atomic():
        state = MeteringState.objects.select_for_update().get(pk=state.pk)
        charged = _settle(deployment, state, due, fields)
        MeteringState.objects.filter(pk=state.pk).update(**fields)
        if any(charged):
            _unattributed_add(deployment, now, charged)
    if any(charged):
        logger.info(
            "metering of %s: %d prompt and %d completion tokens counted by vLLM "
            "with no span (aborted requests): charged as unattributed",
            deployment.name,
            *charged,
        )
    return charged


def _settle(deployment, state: MeteringState, due: list, fields: dict) -> tuple[int, int]:
    """Settles the readings `due` in order (into `fields`); returns the charge."""
    settled_at = state.settled_at
    settled = [state.settled_prompt, state.settled_completion]
    deficit = [state.deficit_prompt, state.deficit_completion]
    for stamp, prompt, completion in due:
        until = datetime.fromtimestamp(stamp, tz=UTC)
        reported = MeteredRequest.objects.filter(
            deployment=deployment, started_at__gte=settled_at, started_at__lt=until
        ).aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
        deficit[0] += prompt - settled[0] - (reported["p"] or 0)
        deficit[1] += completion - settled[1] - (reported["c"] or 0)
        settled, settled_at = [prompt, completion], until
    # Spans of windows settled earlier, recorded since (longer requests).
    deficit[0] -= state.late_prompt - state.late_applied_prompt
    deficit[1] -= state.late_completion - state.late_applied_completion
    charge = (
        max(deficit[0] - state.charged_prompt, 0),
        max(deficit[1] - state.charged_completion, 0),
    )
    fields.update(
        settled_at=settled_at,
        settled_prompt=settled[0],
        settled_completion=settled[1],
        deficit_prompt=deficit[0],
        deficit_completion=deficit[1],
        charged_prompt=state.charged_prompt + charge[0],
        charged_completion=state.charged_completion + charge[1],
        late_applied_prompt=state.late_prompt,
        late_applied_completion=state.late_completion,
    )
    return charge


def _unattributed_add(deployment: Deployment, now: datetime, charge: tuple[int, int]) -> None:
    """Adds to today's row in one INSERT ... ON CONFLICT DO UPDATE that sums."""
    table = connection.ops.quote_name(UnattributedTokens._meta.db_table)
    with connection.cursor() as cursor:
        # Every name here is ours (the model's table and columns); values are parameters.
        cursor.execute(
            f"INSERT INTO {table} (day, deployment_id, prompt_tokens, completion_tokens) "  # noqa: S608
            "VALUES (%s, %s, %s, %s) ON CONFLICT (day, deployment_id) DO UPDATE SET "
            f"prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, "
            f"completion_tokens = {table}.completion_tokens + excluded.completion_tokens",
            [
                connection.ops.adapt_datefield_value(now.date()),
                deployment.pk,
                charge[0],
                charge[1],
            ],
        )
