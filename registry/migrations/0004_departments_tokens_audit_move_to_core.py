
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0001_initial'),
        ('registry', '0003_mlflow_lineage_and_mirror'),
        ('serving', '0003_departments_move_to_core'),
    ]

    # State only: these models now live in core, on the same tables; no column or constraint changes.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='auditevent',
                    name='actor_token',
                ),
                migrations.AlterField(
                    model_name='adapterversion',
                    name='registered_via_token',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='core.apitoken'),
                ),
                migrations.RemoveField(
                    model_name='auditevent',
                    name='actor',
                ),
                migrations.RemoveField(
                    model_name='auditevent',
                    name='department',
                ),
                migrations.RemoveField(
                    model_name='membership',
                    name='department',
                ),
                migrations.AlterField(
                    model_name='adapter',
                    name='department',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='adapters', to='core.department'),
                ),
                migrations.RemoveField(
                    model_name='membership',
                    name='user',
                ),
                migrations.DeleteModel(
                    name='ApiToken',
                ),
                migrations.DeleteModel(
                    name='AuditEvent',
                ),
                migrations.DeleteModel(
                    name='Department',
                ),
                migrations.DeleteModel(
                    name='Membership',
                ),
            ],
            database_operations=[],
        ),
    ]
