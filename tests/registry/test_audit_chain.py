"""The audit log is tamper-evident (a hash chain checked by `manage.py
audit_verify`), and on PostgreSQL the table refuses TRUNCATE too."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from core.audit import audit_record
from core.models import AuditEvent
from tests.conftest import actor, requires_postgres

pytestmark = pytest.mark.django_db

ROW_TRIGGER = "registry_auditevent_no_update_delete"


def record(user, department, n=3):
    for i in range(n):
        audit_record(
            actor=actor(user),
            action="test.event",
            obj=department,
            department=department,
            comment=f"event {i}",
            details={"n": i, "nested": {"b": [1, 2.5], "a": "é"}},
        )


def raw_sql(sql, params=()):
    """As someone with direct database access would, past the ORM's guards."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The test's transaction has deferred foreign-key checks pending, and
            # PostgreSQL alters no table with pending trigger events: run them now.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE registry_auditevent DISABLE TRIGGER {ROW_TRIGGER}")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE registry_auditevent ENABLE TRIGGER {ROW_TRIGGER}")


def verify() -> str:
    out = StringIO()
    call_command("audit_verify", stdout=out)
    return out.getvalue()


def test_an_untouched_log_verifies_and_prints_its_head(root, legal):
    record(root, legal)
    head = AuditEvent.objects.order_by("-id").first()
    events = list(AuditEvent.objects.order_by("id"))
    assert events[0].prev_hash == "" and all(
        later.prev_hash == earlier.hash for earlier, later in zip(events, events[1:], strict=False)
    )
    assert f"head {head.hash}" in verify()


def test_a_changed_row_is_the_first_broken_link(root, legal):
    record(root, legal)
    second = AuditEvent.objects.order_by("id")[1]
    raw_sql("UPDATE registry_auditevent SET comment = %s WHERE id = %s", ["nothing", second.pk])

    with pytest.raises(CommandError, match=f"broken at event {second.pk}: its fields"):
        verify()


def test_a_removed_row_breaks_the_link_after_it(root, legal):
    record(root, legal)
    first, second, third = AuditEvent.objects.order_by("id")[:3]
    raw_sql("DELETE FROM registry_auditevent WHERE id = %s", [second.pk])

    with pytest.raises(CommandError, match=f"broken at event {third.pk}: its prev_hash"):
        verify()


def test_a_rewritten_chain_is_caught_by_the_head_kept_elsewhere(root, legal):
    from core.audit_chain import event_hash

    record(root, legal)
    kept = AuditEvent.objects.order_by("-id").first().hash
    # The database owner rewrites the last event and recomputes its hash.
    last = AuditEvent.objects.order_by("-id").first()
    last.comment = "rewritten"
    raw_sql(
        "UPDATE registry_auditevent SET comment = %s, hash = %s WHERE id = %s",
        ["rewritten", event_hash(last), last.pk],
    )
    verify()  # a rewritten chain verifies by itself...
    with pytest.raises(CommandError, match="rewritten"):
        call_command("audit_verify", expect_head=kept, stdout=StringIO())


@requires_postgres()
def test_postgres_refuses_truncate_of_the_audit_table(root, legal):
    from django.db import DatabaseError

    record(root, legal, n=1)
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as in raw_sql
        cursor.execute("TRUNCATE registry_auditevent CASCADE")
    assert AuditEvent.objects.exists()


@pytest.mark.postgres
@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_do_not_fork_the_chain(root, legal):
    barrier = threading.Barrier(6)
    errors = []

    def write():
        try:
            barrier.wait(timeout=30)
            for _ in range(5):
                with transaction.atomic():
                    record(root, legal, n=1)
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=write) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors, errors
    assert AuditEvent.objects.filter(action="test.event").count() == 30
    assert "Audit chain intact" in verify()


def test_export_writes_the_verified_head_for_shipping(root, legal, tmp_path):
    import json

    record(root, legal)
    head = AuditEvent.objects.order_by("-id").first().hash

    out = StringIO()
    call_command("audit_verify", export="-", stdout=out)
    shipped = json.loads(out.getvalue())
    assert shipped["head"] == head and shipped["events"] == 3 and shipped["verified_at"]

    target = tmp_path / "head.json"
    call_command("audit_verify", export=str(target), stdout=StringIO())
    assert json.loads(target.read_text())["head"] == head
    # What was shipped is what --expect-head later checks.
    call_command("audit_verify", expect_head=shipped["head"], stdout=StringIO())


def test_a_broken_chain_exports_nothing(root, legal, tmp_path):
    record(root, legal)
    last = AuditEvent.objects.order_by("-id").first()
    raw_sql("UPDATE registry_auditevent SET comment = %s WHERE id = %s", ["rewritten", last.pk])
    target = tmp_path / "head.json"
    with pytest.raises(CommandError, match="broken"):
        call_command("audit_verify", export=str(target), stdout=StringIO())
    assert not target.exists()
