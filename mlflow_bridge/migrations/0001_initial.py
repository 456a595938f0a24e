import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('registry', '0004_departments_tokens_audit_move_to_core'),
    ]

    # State only: the tables were created by the registry app (0003) and keep their names.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='MlflowAliasMirror',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('state', models.CharField(choices=[('pending', 'Pending'), ('synced', 'Synced'), ('failed', 'Failed')], default='pending', max_length=16)),
                        ('generation', models.PositiveIntegerField(default=1)),
                        ('synced_generation', models.PositiveIntegerField(default=0)),
                        ('attempts', models.PositiveIntegerField(default=0, help_text='Attempts since the last success.')),
                        ('last_error', models.TextField(blank=True)),
                        ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                        ('synced_at', models.DateTimeField(blank=True, null=True)),
                        ('claimed_until', models.DateTimeField(blank=True, null=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('deployment_name', models.CharField(max_length=200)),
                        ('alias', models.CharField(max_length=200)),
                        ('adapter', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='mlflow_aliases', to='registry.adapter')),
                        ('version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='mlflow_aliases', to='registry.adapterversion')),
                    ],
                    options={
                        'db_table': 'registry_mlflowaliasmirror',
                        'indexes': [models.Index(fields=['state'], name='registry_ml_state_9e7a28_idx')],
                        'constraints': [models.UniqueConstraint(fields=('adapter', 'alias'), name='mlflow_alias_per_adapter')],
                    },
                ),
                migrations.CreateModel(
                    name='MlflowVersionMirror',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('state', models.CharField(choices=[('pending', 'Pending'), ('synced', 'Synced'), ('failed', 'Failed')], default='pending', max_length=16)),
                        ('generation', models.PositiveIntegerField(default=1)),
                        ('synced_generation', models.PositiveIntegerField(default=0)),
                        ('attempts', models.PositiveIntegerField(default=0, help_text='Attempts since the last success.')),
                        ('last_error', models.TextField(blank=True)),
                        ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                        ('synced_at', models.DateTimeField(blank=True, null=True)),
                        ('claimed_until', models.DateTimeField(blank=True, null=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('registered_model', models.CharField(blank=True, max_length=256)),
                        ('model_version', models.CharField(blank=True, max_length=32)),
                        ('synced_status', models.CharField(blank=True, max_length=20)),
                        ('version', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='mlflow_mirror', to='registry.adapterversion')),
                    ],
                    options={
                        'db_table': 'registry_mlflowversionmirror',
                        'indexes': [models.Index(fields=['state'], name='registry_ml_state_51ab1d_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
