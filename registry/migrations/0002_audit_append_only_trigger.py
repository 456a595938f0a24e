"""On PostgreSQL the database itself refuses UPDATE and DELETE of audit events,
so not even a raw SQL session through the app's role can rewrite history."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION registry_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER registry_auditevent_no_update_delete
    BEFORE UPDATE OR DELETE ON registry_auditevent
    FOR EACH ROW EXECUTE FUNCTION registry_auditevent_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS registry_auditevent_no_update_delete ON registry_auditevent;
DROP FUNCTION IF EXISTS registry_auditevent_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
