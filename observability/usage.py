"""Requests and errors per adapter, counted at the deployment's front door and
rolled up per day (DailyUsage).

HAProxy's counters are cumulative since its worker started, and start again at
zero when it reloads. Each reconcile reads them, keeps the reading
(FrontDoorReading) and adds to today's rows only what grew since the previous
one. A counter lower than before means a reload in between: everything it
shows now is new. (Requests the old worker answered after the previous reading
are lost with it; a reconcile every few seconds keeps that small.)

Runs under the reconcile's claim (serving.reconcile.tick): no other writer
of the deployment's rows, so no row lock. An unchanged reading writes nothing.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction
from django.utils import timezone

from observability.models import DailyUsage, FrontDoorReading
from serving.door.haproxy import DoorError
from serving.door.services import front_door_for
from serving.models import Deployment, ServedAdapter

logger = logging.getLogger(__name__)

Counters = tuple[int, int, int]  # requests, errors_4xx, errors_5xx


def counter_increase(previous: int | None, current: int) -> int:
    """What a cumulative counter counted since `previous` (None: never read)."""
    if previous is None or current < previous:  # first reading, or reset by a reload
        return current
    return current - previous


def counters_increase(previous: dict, current: dict[str, Counters]) -> dict[str, Counters]:
    """Per served name, what each of its counters counted since `previous`;
    names that counted nothing are left out."""
    grown: dict[str, Counters] = {}
    for name, now in current.items():
        before = previous.get(name) or (None, None, None)
        step = (
            counter_increase(before[0], now[0]),
            counter_increase(before[1], now[1]),
            counter_increase(before[2], now[2]),
        )
        if any(step):
            grown[name] = step
    return grown


def front_door_usage_record(deployment: Deployment) -> int:
    """Reads the deployment's front door counters and adds what grew to
    today's usage. Returns the requests added (0: nothing written)."""
    door = front_door_for(deployment)
    if door is None:
        return 0
    try:
        counters = door.model_counters()
    except DoorError as error:
        # Down or reloading: the counts wait for the next reading (a reset is handled).
        logger.warning("usage of %s not read: %s", deployment.name, error)
        return 0
    current = {name: (c.requests, c.errors_4xx, c.errors_5xx) for name, c in counters.items()}
    reading = FrontDoorReading.objects.filter(deployment=deployment).first()
    previous = reading.counters if reading is not None else {}
    if reading is not None and previous == {k: list(v) for k, v in current.items()}:
        return 0
    grown = counters_increase(previous, current)
    now = timezone.now()
    # The counts and the reading they came from, together or not at all: a death
    # between the two would otherwise count the same requests again next tick.
    with transaction.atomic():
        if grown:
            _usage_add(deployment, grown)
        if reading is None:
            FrontDoorReading.objects.create(deployment=deployment, counters=current, read_at=now)
        else:
            FrontDoorReading.objects.filter(pk=reading.pk).update(counters=current, read_at=now)
    return sum(step[0] for step in grown.values())


def _usage_add(deployment: Deployment, grown: dict[str, Counters]) -> None:
    """Adds the counts to today's rows, in one INSERT ... ON CONFLICT DO UPDATE
    that sums (Django's bulk_create can only overwrite on conflict)."""
    served = {
        row["adapter__served_name"]: row
        for row in ServedAdapter.objects.filter(
            deployment=deployment, adapter__served_name__in=list(grown)
        ).values(
            "adapter_id",
            "adapter__served_name",
            "adapter__department_id",
            "version_id",
            "version__number",
        )
    }
    today = timezone.now().date()
    rows = []
    for name, (requests, errors_4xx, errors_5xx) in sorted(grown.items()):
        row = served.get(name)
        if row is None:  # a backend the database no longer knows (deleted): nobody to bill
            logger.warning("front door of %s counts unknown adapter %s", deployment.name, name)
            continue
        rows.append(
            (
                today.isoformat(),
                deployment.pk,
                row["adapter__department_id"],
                row["adapter_id"],
                name,
                row["version_id"],
                row["version__number"] or 0,
                requests,
                errors_4xx,
                errors_5xx,
            )
        )
    if not rows:
        return
    table = connection.ops.quote_name(DailyUsage._meta.db_table)
    columns = (
        "day, deployment_id, department_id, adapter_id, served_name, version_id, "
        "version_number, requests, errors_4xx, errors_5xx"
    )
    values = ", ".join(["(" + ", ".join(["%s"] * 10) + ")"] * len(rows))
    summed = ", ".join(
        f"{c} = {table}.{c} + excluded.{c}" for c in ("requests", "errors_4xx", "errors_5xx")
    )
    # Every name here is ours (the model's table and columns); values are parameters.
    sql = (
        f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
        f"ON CONFLICT (day, deployment_id, adapter_id, version_number) DO UPDATE SET {summed}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [value for row in rows for value in row])
