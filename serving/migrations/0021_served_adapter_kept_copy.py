from django.db import migrations


class Migration(migrations.Migration):
    """ServedAdapter.retained is the record of kept copies (serving/rules/kept_copies.py);
    "retention" is the artifact store's word (registry/services/retention.py)."""

    dependencies = [
        ("serving", "0020_own_probe"),
    ]

    operations = [
        migrations.RenameField(
            model_name="servedadapter",
            old_name="retained",
            new_name="kept_copy",
        ),
    ]
