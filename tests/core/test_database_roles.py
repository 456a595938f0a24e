"""Issue 21, item 6: the application's database role cannot erase the audit trail.

The shipped manifests ran web, workers and the migration job as one role, the
tables' owner, which can `ALTER TABLE ... DISABLE TRIGGER` and then rewrite
the audit log. With two roles (`manage.py db_grant_app_role`) the application
role reads and writes rows but owns no table. PostgreSQL only, as a real
second login to the test database.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from core.audit import audit_record
from tests.conftest import actor, requires_postgres

pytestmark = [
    pytest.mark.postgres,
    requires_postgres(),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def app_role():
    role = f"registry_app_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN PASSWORD %s", [password])
    try:
        yield role, password
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


def connect_as(role: str, password: str) -> psycopg.Connection:
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        dbname=settings["NAME"],
        user=role,
        password=password,
        autocommit=True,
    )


def test_the_application_role_cannot_disable_the_audit_triggers(app_role, root, legal):
    role, password = app_role
    audit_record(actor=actor(root), action="test.event", obj=legal, department=legal)
    call_command("db_grant_app_role", role)

    with connect_as(role, password) as app:
        # It works: reads and appends like the web process does.
        assert app.execute("SELECT count(*) FROM registry_auditevent").fetchone()[0] == 1
        app.execute("UPDATE registry_department SET name = 'Legal dept' WHERE slug = 'legal'")
        for statement in (
            "ALTER TABLE registry_auditevent DISABLE TRIGGER registry_auditevent_no_update_delete",
            "ALTER TABLE registry_auditevent DISABLE TRIGGER ALL",
            "DROP TRIGGER registry_auditevent_no_truncate ON registry_auditevent",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
                app.execute(statement)
        for statement in (
            "UPDATE registry_auditevent SET comment = 'rewritten'",
            "DELETE FROM registry_auditevent",
            "TRUNCATE registry_auditevent",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                app.execute(statement)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), min(comment) FROM registry_auditevent")
        assert cursor.fetchone() == (1, "")


def test_it_refuses_a_role_that_does_not_exist(app_role):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No database role"):
        call_command("db_grant_app_role", "no_such_role_here")
