"""Gives the application's database role what it needs and nothing more.

    manage.py db_grant_app_role registry_app      (run by the migration job, as the owner)

Two roles (docker-compose.yml, deploy/kustomize): the migration job connects as
the role that owns the tables; web, workers and beat connect as the
application role, which this grants SELECT, INSERT, UPDATE and DELETE on every
table and USAGE on every sequence, and on the audit table only SELECT and
INSERT. A role that does not own a table cannot ALTER it, so it cannot disable
the audit table's triggers, nor TRUNCATE or rewrite the table. Default
privileges cover the tables later migrations create; running it again is
harmless. PostgreSQL only.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from psycopg import sql

AUDIT_TABLE = "registry_auditevent"


class Command(BaseCommand):
    help = "Grant the application's database role its privileges (PostgreSQL, as the owner)."

    def add_arguments(self, parser):
        parser.add_argument("role", help="The role web, workers and beat connect as.")

    def handle(self, *args, role: str, **options):
        if connection.vendor != "postgresql":
            raise CommandError("db_grant_app_role is for PostgreSQL.")
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                raise CommandError(f"No database role {role!r}: create it first (LOGIN, no owner).")
            cursor.execute("SELECT current_user")
            (owner,) = cursor.fetchone()
            if owner == role:
                raise CommandError(
                    "Run this as the role that owns the tables (the migration job's), "
                    "not as the application role."
                )
        name = sql.Identifier(role)
        statements = [
            sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name),
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
            ).format(name),
            sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(name),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA public "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}"
            ).format(name),
            sql.SQL(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {}"
            ).format(name),
            # Append-only: no UPDATE, DELETE or TRUNCATE, whatever the triggers say.
            sql.SQL("REVOKE UPDATE, DELETE, TRUNCATE ON {} FROM {}").format(
                sql.Identifier(AUDIT_TABLE), name
            ),
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(AUDIT_TABLE), name),
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement.as_string(cursor.connection))
        self.stdout.write(f"Granted {role} the application's privileges (owner: {owner}).")
