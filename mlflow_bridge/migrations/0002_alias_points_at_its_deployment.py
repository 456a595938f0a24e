import django.db.models.deletion
from django.db import migrations, models


def link_deployments(apps, schema_editor):
    """Each alias row named its deployment; point it at the row instead. An
    alias whose deployment no longer exists has nothing left to mirror."""
    Alias = apps.get_model('mlflow_bridge', 'MlflowAliasMirror')
    Deployment = apps.get_model('serving', 'Deployment')
    ids = dict(Deployment.objects.values_list('name', 'pk'))
    for row in Alias.objects.all():
        if row.deployment_name in ids:
            Alias.objects.filter(pk=row.pk).update(deployment_id=ids[row.deployment_name])
        else:
            Alias.objects.filter(pk=row.pk).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('mlflow_bridge', '0001_initial'),
        ('registry', '0005_mlflow_mirror_moves_to_its_app'),
        ('serving', '0003_departments_move_to_core'),
    ]

    operations = [
        migrations.AddField(
            model_name='mlflowaliasmirror',
            name='claimed_by',
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AddField(
            model_name='mlflowversionmirror',
            name='claimed_by',
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AddField(
            model_name='mlflowaliasmirror',
            name='deployment',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='mlflow_aliases', to='serving.deployment'),
        ),
        migrations.RunPython(link_deployments, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='mlflowaliasmirror',
            name='deployment',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='mlflow_aliases', to='serving.deployment'),
        ),
        migrations.RemoveField(
            model_name='mlflowaliasmirror',
            name='deployment_name',
        ),
    ]
