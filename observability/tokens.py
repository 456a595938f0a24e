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
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from observability.metering import SpanTokens, attribution
from observability.models import DailyTokens, MeteredRequest
from registry.models import AdapterVersion
from serving.models import Deployment, InferenceKey

logger = logging.getLogger(__name__)

BATCH = 500


def _chunks(rows: list, size: int = BATCH) -> Iterable[list]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def metered_spans_record(deployment: Deployment, spans: list[SpanTokens]) -> int:
    """Adds the spans a replica of `deployment` exported; returns how many were
    new (a span already recorded is skipped). The key and version named in a
    request id are looked up: one that does not exist (any more) is recorded
    as none, never invented."""
    unique = {span.request_id: span for span in spans}
    if not unique:
        return 0
    found = {rid: attribution(rid) for rid in unique}
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
    for rid, span in unique.items():
        who = found[rid]
        key = who.key_id if who and who.key_id in keys else None
        version = who.version_id if who and who.version_id in versions else None
        ledger.append(
            (
                rid,
                deployment.pk,
                ops.adapt_datetimefield_value(span.finished_at),
                key,
                keys.get(key),
                version,
                span.prompt_tokens,
                span.completion_tokens,
            )
        )
    table = ops.quote_name(MeteredRequest._meta.db_table)
    columns = (
        "request_id, deployment_id, finished_at, key_id, department_id, version_id, "
        "prompt_tokens, completion_tokens"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        inserted = set()
        for chunk in _chunks(ledger):
            values = ", ".join(["(" + ", ".join(["%s"] * 8) + ")"] * len(chunk))
            # Every name here is ours (the model's table and columns); values are parameters.
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                "ON CONFLICT (request_id) DO NOTHING RETURNING request_id",
                [value for row in chunk for value in row],
            )
            inserted.update(row[0] for row in cursor.fetchall())
        if inserted:
            _days_add(cursor, deployment, [r for r in ledger if r[0] in inserted], unique, versions)
    if len(inserted) < len(unique):
        logger.info(
            "metering of %s: %d of %d spans already recorded (a resent batch)",
            deployment.name,
            len(unique) - len(inserted),
            len(unique),
        )
    return len(inserted)


def _days_add(cursor, deployment, rows, spans: dict[str, SpanTokens], versions) -> None:
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
