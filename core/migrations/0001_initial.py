
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('registry', '0003_mlflow_lineage_and_mirror'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    # State only: the tables were created by the registry app and keep their names (db_table).
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Department',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(max_length=64, unique=True)),
                        ('name', models.CharField(max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'registry_department',
                        'ordering': ['slug'],
                    },
                ),
                migrations.CreateModel(
                    name='ApiToken',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('prefix', models.CharField(db_index=True, max_length=16)),
                        ('secret_sha256', models.CharField(max_length=64, unique=True)),
                        ('abilities', models.JSONField(default=list)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField()),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('created_by', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
                        ('revoked_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('department', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to='core.department')),
                    ],
                    options={
                        'db_table': 'registry_apitoken',
                        'ordering': ['-created_at'],
                    },
                ),
                migrations.CreateModel(
                    name='AuditEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                        ('actor_label', models.CharField(max_length=200)),
                        ('action', models.CharField(db_index=True, max_length=64)),
                        ('object_type', models.CharField(max_length=64)),
                        ('object_id', models.CharField(max_length=64)),
                        ('object_repr', models.CharField(max_length=300)),
                        ('from_state', models.CharField(blank=True, max_length=32)),
                        ('to_state', models.CharField(blank=True, max_length=32)),
                        ('comment', models.TextField(blank=True)),
                        ('request_id', models.CharField(blank=True, max_length=64)),
                        ('client_address', models.GenericIPAddressField(blank=True, null=True)),
                        ('details', models.JSONField(blank=True, default=dict)),
                        ('actor', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('actor_token', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='core.apitoken')),
                        ('department', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='core.department')),
                    ],
                    options={
                        'db_table': 'registry_auditevent',
                        'ordering': ['-created_at', '-id'],
                        'indexes': [models.Index(fields=['object_type', 'object_id'], name='registry_au_object__49c75b_idx')],
                    },
                ),
                migrations.CreateModel(
                    name='Membership',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('member', 'Member'), ('approver', 'Approver')], default='member', max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('department', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to='core.department')),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'registry_membership',
                        'ordering': ['department__slug', 'user__username'],
                        'constraints': [models.UniqueConstraint(fields=('user', 'department'), name='one_membership_per_department')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
