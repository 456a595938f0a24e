
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0001_initial'),
        ('serving', '0002_encrypt_vllm_api_key'),
    ]

    # State only: the same table and column, now pointing at core's Department.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='deployment',
                    name='allowed_departments',
                    field=models.ManyToManyField(blank=True, help_text='Empty means every department.', related_name='+', to='core.department'),
                ),
            ],
            database_operations=[],
        ),
    ]
