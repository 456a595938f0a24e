"""Claims (leases) on rows, for every kind of background work.

A worker claims a row with one conditional UPDATE: it gets the row only if
nobody holds it, or the holder's claim has expired. While it works it renews
the claim (only if it still holds it), and it lets go only of a claim that is
its own. A worker that dies simply stops renewing, and after a few seconds the
row is free for the sweeper or the next worker. "0 rows updated" always means
"someone else got there first", never an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, connections, models
from django.db.models import Q
from django.utils import timezone


@dataclass(frozen=True)
class Lease:
    """Where a claim lives on a model: the owner column and the expiry column."""

    model: type[models.Model]
    owner_field: str
    until_field: str

    def free(self, now: datetime | None = None) -> Q:
        """Rows nobody holds: never claimed, released, or the claim expired."""
        now = now or timezone.now()
        return Q(**{f"{self.until_field}__isnull": True}) | Q(**{f"{self.until_field}__lt": now})

    def claim(self, pk, owner: str, seconds: float) -> bool:
        """Takes the row if it is free or already ours (a redelivered task resumes)."""
        now = timezone.now()
        mine = Q(**{self.owner_field: owner})
        taken = (
            self.model._default_manager.filter(pk=pk)
            .filter(self.free(now) | mine)
            .update(**{self.owner_field: owner, self.until_field: now + timedelta(seconds=seconds)})
        )
        return taken == 1

    def renew(self, pk, owner: str, seconds: float) -> bool:
        """Extends our claim; False means we lost it (expired and taken by another)."""
        renewed = self.model._default_manager.filter(pk=pk, **{self.owner_field: owner}).update(
            **{self.until_field: timezone.now() + timedelta(seconds=seconds)}
        )
        return renewed == 1

    def release(self, pk, owner: str, **also) -> bool:
        """Lets go of the claim only if it is still ours; `also` are columns set
        in the same UPDATE (a finished run's timestamp, say)."""
        released = self.model._default_manager.filter(pk=pk, **{self.owner_field: owner}).update(
            **{self.owner_field: "", self.until_field: None}, **also
        )
        return released == 1

    # Many rows at once, for work that spans many rows (a reconcile repairing
    # hundreds of adapters): a constant number of statements, whatever the count.

    def claim_many(self, pks, owner: str, seconds: float) -> set:
        """Takes every free (or already ours) row of `pks`; returns those we hold."""
        now = timezone.now()
        rows = self.model._default_manager.filter(pk__in=list(pks))
        rows.filter(self.free(now) | Q(**{self.owner_field: owner})).update(
            **{self.owner_field: owner, self.until_field: now + timedelta(seconds=seconds)}
        )
        return set(rows.filter(**{self.owner_field: owner}).values_list("pk", flat=True))

    def renew_many(self, pks, owner: str, seconds: float) -> int:
        return self.model._default_manager.filter(
            pk__in=list(pks), **{self.owner_field: owner}
        ).update(**{self.until_field: timezone.now() + timedelta(seconds=seconds)})

    def release_many(self, pks, owner: str) -> int:
        return self.model._default_manager.filter(
            pk__in=list(pks), **{self.owner_field: owner}
        ).update(**{self.owner_field: "", self.until_field: None})


class LeaseLost(Exception):
    """Another worker holds the claim now: stop, and leave the work to it."""


class Heartbeat:
    """Renews a claim from inside long work (between phases, during retry
    back-off), at most once per third of the claim's length, so a short claim
    stays held for as long as the work really goes on.

    A database error while renewing (a dropped connection, a failover) is not
    yet a lost claim: the next beat tries again on a new connection, and only
    once two thirds of the claim have passed without a renewal does the holder
    give up, before anyone else may take the row.
    """

    def __init__(self, lease: Lease, pk, owner: str, seconds: float):
        self.lease, self.pk, self.owner, self.seconds = lease, pk, owner, seconds
        self._last = self._renewed = time.monotonic()

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.seconds / 3:
            return
        try:
            renewed = self.lease.renew(self.pk, self.owner, self.seconds)
        except DatabaseError:
            connection = connections[self.lease.model._default_manager.db]
            if not connection.in_atomic_block:  # a broken connection is replaced on next use
                connection.close_if_unusable_or_obsolete()
            if now - self._renewed < self.seconds * 2 / 3:
                return
            raise LeaseLost(
                f"{self.lease.model.__name__} {self.pk}: could not renew the claim in time"
            ) from None
        if not renewed:
            raise LeaseLost(f"{self.lease.model.__name__} {self.pk} is no longer held by us")
        self._last = self._renewed = now

    def sleep(self, seconds: float) -> None:
        """time.sleep that keeps the claim alive while it waits."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, max(self.seconds / 3, 0.05)))
            self.beat()
