"""Status changes for every state machine: one explicit table per machine,
applied with compare-and-swap.

`move()` is a conditional UPDATE on the OLD status. If another worker changed
the row first, 0 rows match and it returns False: the caller re-reads and
decides again, instead of overwriting a state it never saw.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db import models

from core.errors import Conflict

Table = Mapping[str, frozenset[str]]


def can_move(table: Table, current: str, target: str) -> bool:
    """Re-entering the current state is allowed, so a redelivered task can resume."""
    return current == target or target in table.get(current, frozenset())


def move(
    instance: models.Model,
    table: Table,
    target: str,
    *,
    field: str = "status",
    **changes,
) -> bool:
    """Moves `instance` from the status it was read with to `target`.

    Raises Conflict if the table forbids the move. Returns False, and leaves
    the row alone, if the status in the database is no longer the one read.
    On success the instance is updated in memory too.
    """
    current = getattr(instance, field)
    if not can_move(table, current, target):
        raise Conflict(
            f"Cannot move from {current} to {target}.",
            code="invalid_transition",
            details={"status": current, "target": target},
        )
    updated = (
        type(instance)
        ._default_manager.filter(pk=instance.pk, **{field: current})
        .update(**{field: target}, **changes)
    )
    if updated != 1:
        return False
    setattr(instance, field, target)
    for name, value in changes.items():
        setattr(instance, name, value)
    return True
