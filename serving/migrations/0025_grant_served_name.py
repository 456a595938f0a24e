"""A grant keeps the name it asked for, and may name no adapter (a request for
a name nobody serves is kept and answered like any other: docs/security.md)."""

import django.db.models.deletion
from django.db import migrations, models


def names_from_adapters(apps, schema_editor):
    AdapterGrant = apps.get_model("serving", "AdapterGrant")
    Adapter = apps.get_model("registry", "Adapter")
    AdapterGrant.objects.update(
        served_name=models.Subquery(
            Adapter.objects.filter(pk=models.OuterRef("adapter_id")).values("served_name")[:1]
        )
    )


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0001_initial"),
        ("serving", "0024_door_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="adaptergrant",
            name="served_name",
            field=models.CharField(default="", max_length=128),
            preserve_default=False,
        ),
        migrations.RunPython(names_from_adapters, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="adaptergrant",
            name="adapter",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="grants",
                to="registry.adapter",
            ),
        ),
        migrations.AddConstraint(
            model_name="adaptergrant",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("adapter__isnull", True), ("status__in", ["requested", "approved"])
                ),
                fields=("served_name", "department"),
                name="one_live_unknown_grant_per_name_department",
            ),
        ),
    ]
