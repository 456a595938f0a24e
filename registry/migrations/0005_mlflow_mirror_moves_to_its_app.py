from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0004_departments_tokens_audit_move_to_core'),
        ('mlflow_bridge', '0001_initial'),
    ]

    # State only: the mirror tables now belong to the mlflow_bridge app.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='MlflowAliasMirror'),
                migrations.DeleteModel(name='MlflowVersionMirror'),
            ],
            database_operations=[],
        ),
    ]
