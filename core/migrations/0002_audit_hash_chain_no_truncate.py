"""The audit log's hash chain (core.audit_chain), computed for the events that
exist, and on PostgreSQL a statement trigger that refuses TRUNCATE of the audit
table (row triggers do not see TRUNCATE)."""

import hashlib
import json

import django.utils.timezone
from django.db import migrations, models

FIELDS = (
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

NO_TRUNCATE = """
CREATE TRIGGER registry_auditevent_no_truncate
    BEFORE TRUNCATE ON registry_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION registry_auditevent_append_only();
"""
ROW_TRIGGER = "registry_auditevent_no_update_delete"


def _hash(row: dict, prev: str) -> str:
    # A frozen copy of core.audit_chain.canonical: migrations must not change
    # when the code does.
    values = {name: row[name] for name in FIELDS}
    values["created_at"] = row["created_at"].isoformat(timespec="microseconds")
    values["prev_hash"] = prev
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def chain_existing(apps, schema_editor):
    AuditEvent = apps.get_model("core", "AuditEvent")
    postgres = schema_editor.connection.vendor == "postgresql"
    if postgres:
        schema_editor.execute(f"ALTER TABLE registry_auditevent DISABLE TRIGGER {ROW_TRIGGER}")
    prev = ""
    for row in AuditEvent.objects.order_by("id").values("id", *FIELDS).iterator():
        digest = _hash(row, prev)
        AuditEvent.objects.filter(pk=row["id"]).update(prev_hash=prev, hash=digest)
        prev = digest
    if postgres:
        schema_editor.execute(f"ALTER TABLE registry_auditevent ENABLE TRIGGER {ROW_TRIGGER}")
        schema_editor.execute(NO_TRUNCATE)


def unchain(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP TRIGGER IF EXISTS registry_auditevent_no_truncate ON registry_auditevent"
        )


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="auditevent",
            name="created_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="prev_hash",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="hash",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
        migrations.RunPython(chain_existing, unchain),
    ]
