"""Writes vLLM's token counts (observability.metering reads them): each span
becomes a MeteredRequest keyed by its request id, and its counts are added to
the day's DailyTokens row, in one transaction.

Exactly once: the ledger's unique request id makes a resent batch (the exporter
retries when it got no answer, e.g. a worker killed mid-write) add nothing, and
the day rows grow only by the rows this transaction inserted. Two writers of
the same batch at once: the second waits on the first's uncommitted rows, then
inserts none of them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from observability.metering import SpanTokens, attribution, implausible
from observability.models import DailyTokens, MeteredRequest, MeteringState
from registry.models import AdapterVersion
from serving.models import AdapterGrant, Deployment, GrantStatus, InferenceKey

logger = logging.getLogger(__name__)

BATCH = 500


def _chunks(rows: list, size: int = BATCH) -> Iterable[list]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def metered_spans_record(deployment: Deployment, spans: list[SpanTokens]) -> int:
    """Adds the spans a replica of `deployment` exported; returns how many were
    new (a span already recorded is skipped). The key and version named in a
    request id are looked up: one that does not exist (any more) is recorded
    as none, never invented. The receiver admits spans first (spans_admitted)."""
    # One row per span: a request's `n` choices share its request id.
    unique = {(span.request_id, span.span_id): span for span in spans}
    if not unique:
        return 0
    found = {ref: attribution(ref[0]) for ref in unique}
    key_ids = {a.key_id for a in found.values() if a and a.key_id}
    version_ids = {a.version_id for a in found.values() if a and a.version_id}
    keys = dict(InferenceKey.objects.filter(pk__in=key_ids).values_list("pk", "department_id"))
    versions = {
        row["pk"]: row
        for row in AdapterVersion.objects.filter(pk__in=version_ids).values(
            "pk", "number", "adapter_id", "adapter__served_name", "adapter__department_id"
        )
    }
    ops = connection.ops
    ledger = []
    for ref, span in unique.items():
        who = found[ref]
        key = who.key_id if who and who.key_id in keys else None
        version = who.version_id if who and who.version_id in versions else None
        ledger.append(
            (
                ref,
                deployment.pk,
                ops.adapt_datetimefield_value(span.finished_at),
                key,
                keys.get(key) if key is not None else None,
                version,
                span.prompt_tokens,
                span.completion_tokens,
            )
        )
    table = ops.quote_name(MeteredRequest._meta.db_table)
    columns = (
        "request_id, span_id, started_at, deployment_id, finished_at, key_id, department_id, "
        "version_id, prompt_tokens, completion_tokens"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # The reconcile settles by when requests started (observability.unmetered):
        # holding its row while these are written makes a span either seen by its
        # settlement or counted late here, never neither.
        state = _metering_state_locked(deployment)
        inserted: set[tuple[str, str]] = set()  # (request_id, span_id), as in `unique`
        for chunk in _chunks(ledger):
            values = ", ".join(["(" + ", ".join(["%s"] * 10) + ")"] * len(chunk))
            params = []
            for (rid, span_id), *rest in chunk:
                started = unique[(rid, span_id)].started_at
                params += [rid, span_id, started and ops.adapt_datetimefield_value(started)]
                params += rest
            # Every name here is ours (the model's table and columns); values are parameters.
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                "ON CONFLICT (request_id, span_id) DO NOTHING RETURNING request_id, span_id",
                params,
            )
            inserted.update((row[0], row[1]) for row in cursor.fetchall())
        if inserted:
            _days_add(cursor, deployment, [r for r in ledger if r[0] in inserted], unique, versions)
        _metering_state_note(state, [unique[ref] for ref in inserted])
    if len(inserted) < len(unique):
        logger.info(
            "metering of %s: %d of %d spans already recorded (a resent batch)",
            deployment.name,
            len(unique) - len(inserted),
            len(unique),
        )
    return len(inserted)


def _metering_state_locked(deployment: Deployment) -> MeteringState:
    MeteringState.objects.get_or_create(deployment=deployment)
    return MeteringState.objects.select_for_update().get(deployment=deployment)


def _metering_state_note(state: MeteringState, new: list[SpanTokens]) -> None:
    """The deployment is metered (a span came), and the tokens of new spans that
    started in a window the reconcile has already settled (a request longer
    than its delay): it takes them off the deficit at its next settlement."""
    now = timezone.now()
    late = [
        span
        for span in new
        if state.settled_at is not None and (span.started_at or span.finished_at) < state.settled_at
    ]
    MeteringState.objects.filter(pk=state.pk).update(
        last_span_at=now,
        late_prompt=F("late_prompt") + sum(span.prompt_tokens for span in late),
        late_completion=F("late_completion") + sum(span.completion_tokens for span in late),
    )


def spans_admitted(
    deployment: Deployment, spans: list[SpanTokens], *, now: datetime | None = None
) -> tuple[list[SpanTokens], dict[str, int]]:
    """The spans a replica of `deployment` may report, and how many were refused
    for each reason. A deployment's token proves only that the sender is one of
    its replicas (or holds its token): it may bill only keys whose department may
    call there (allowed on the deployment, or granted one of its adapters), with
    counts within the deployment's context and times vLLM could have sent."""
    now = now or timezone.now()
    kept: list[SpanTokens] = []
    refused: defaultdict[str, int] = defaultdict(int)
    for span in spans:
        reason = implausible(span, now=now, max_context=deployment.max_model_len)
        if reason:
            refused["implausible"] += 1
            continue
        kept.append(span)
    named = {a.key_id for a in (attribution(span.request_id) for span in kept) if a and a.key_id}
    allowed = _keys_allowed(deployment, named) if named else set()
    admitted = []
    for span in kept:
        who = attribution(span.request_id)
        if who is not None and who.key_id is not None and who.key_id not in allowed:
            refused["key not allowed here"] += 1
            continue
        admitted.append(span)
    return admitted, dict(refused)


def _keys_allowed(deployment: Deployment, key_ids: set[int]) -> set[int]:
    """Of these key ids, those whose department may call the deployment: one of
    its allowed departments (none set: every one), or one granted an adapter
    served there (a grant revoked or expired since still covers the requests it
    let in before)."""
    through = Deployment.allowed_departments.through.objects.filter(deployment_id=deployment.pk)
    granted = AdapterGrant.objects.filter(
        department_id=OuterRef("department_id"),
        status__in=(GrantStatus.APPROVED, GrantStatus.EXPIRED, GrantStatus.REVOKED),
        adapter__served_in__deployment=deployment,
    )
    return set(
        InferenceKey.objects.filter(pk__in=key_ids)
        .filter(
            ~Exists(through)
            | Exists(through.filter(department_id=OuterRef("department_id")))
            | Exists(granted)
        )
        .values_list("pk", flat=True)
    )


def _days_add(cursor, deployment, rows, spans: dict[tuple, SpanTokens], versions) -> None:
    """Adds the new ledger rows to their days, in one INSERT ... ON CONFLICT DO
    UPDATE that sums (Django's bulk_create can only overwrite on conflict)."""
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for rid, _, _, key, department, version, prompt, completion in rows:
        day = spans[rid].finished_at.date()
        total = sums[(day, key, department, version)]
        total[0] += 1
        total[1] += prompt
        total[2] += completion
    ops = connection.ops
    values = []
    for (day, key, department, version), (requests, prompt, completion) in sorted(
        sums.items(), key=lambda item: (item[0][0], item[0][1] or 0, item[0][3] or 0)
    ):
        served = versions.get(version)
        values.append(
            (
                ops.adapt_datefield_value(day),
                deployment.pk,
                key or 0,
                version or 0,
                key,
                department,
                served["adapter__department_id"] if served else None,
                served["adapter_id"] if served else None,
                version,
                served["adapter__served_name"] if served else deployment.base_model_name,
                served["number"] if served else 0,
                requests,
                prompt,
                completion,
            )
        )
    table = ops.quote_name(DailyTokens._meta.db_table)
    columns = (
        "day, deployment_id, key_ref, version_ref, key_id, department_id, owner_id, "
        "adapter_id, version_id, served_name, version_number, requests, prompt_tokens, "
        "completion_tokens"
    )
    summed = ", ".join(
        f"{c} = {table}.{c} + excluded.{c}"
        for c in ("requests", "prompt_tokens", "completion_tokens")
    )
    for chunk in _chunks(values, 200):
        placeholders = ", ".join(["(" + ", ".join(["%s"] * 14) + ")"] * len(chunk))
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES {placeholders} "  # noqa: S608
            "ON CONFLICT (day, deployment_id, key_ref, version_ref) "
            f"DO UPDATE SET {summed}",
            [value for row in chunk for value in row],
        )


def metered_requests_prune() -> int:
    """Deletes the per-request rows past their retention
    (OBSERVABILITY_METERED_REQUEST_DAYS), every deployment's; their days stay
    in DailyTokens. A batch resent that late (the exporter gives up within a
    minute) is not a concern. Run by beat (observability.housekeeping), not by
    the reconcile: an in-sync tick stays within its statement budget."""
    cutoff = timezone.now() - timedelta(days=settings.OBSERVABILITY_METERED_REQUEST_DAYS)
    deleted, _ = MeteredRequest.objects.filter(finished_at__lt=cutoff).delete()
    return deleted
