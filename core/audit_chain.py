"""Tamper evidence for the audit log: every event stores a sha256 over a
canonical JSON of its own fields and the previous event's hash, so changing,
removing or reordering any row breaks every link after it.

Writers are serialized while they append, or two concurrent transactions would
both chain onto the same head and fork the chain: on PostgreSQL with a
transaction-scoped advisory lock held until the writer commits; SQLite already
lets one writer in at a time.

What this does not stop: someone who can write the table directly (the
database owner) can recompute the whole chain from any point on. The defence
against that is to keep the head hash somewhere they cannot write
(`manage.py audit_verify` prints it) and compare.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from django.db import connection

# Any constant works; it only has to be the same for every writer.
CHAIN_LOCK_KEY = 0x4155_4449_5401  # "AUDIT"

CHAINED_FIELDS = (
    "created_at",
    "actor_id",
    "actor_token_id",
    "actor_label",
    "action",
    "department_id",
    "object_type",
    "object_id",
    "object_repr",
    "from_state",
    "to_state",
    "comment",
    "request_id",
    "client_address",
    "details",
)


def canonical(event) -> str:
    values = {}
    for name in CHAINED_FIELDS:
        value = getattr(event, name)
        if name == "created_at":
            value = value.isoformat(timespec="microseconds")
        values[name] = value
    values["prev_hash"] = event.prev_hash
    return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(event) -> str:
    return hashlib.sha256(canonical(event).encode()).hexdigest()


def lock_chain() -> None:
    """Call inside the writer's transaction; released when it commits."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CHAIN_LOCK_KEY])


def chain_head() -> str:
    from core.models import AuditEvent

    return AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first() or ""


@dataclass
class Verification:
    checked: int
    head: str
    broken_at: int | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.broken_at is None


def verify_chain() -> Verification:
    """Walks the log in insertion order; stops at the first broken link."""
    from core.models import AuditEvent

    previous = ""
    checked = 0
    for event in AuditEvent.objects.order_by("id").iterator(chunk_size=2000):
        if event.prev_hash != previous:
            return Verification(
                checked,
                previous,
                event.pk,
                "its prev_hash is not the hash of the event before it "
                "(an event was removed, inserted or reordered)",
            )
        if event_hash(event) != event.hash:
            return Verification(
                checked, previous, event.pk, "its fields do not match its hash (it was changed)"
            )
        previous = event.hash
        checked += 1
    return Verification(checked, previous)
