# /metrics reads the jobs settled within its window (capabilities/web/metrics_collector.py).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('capabilities', '0010_rpc_door'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['settled_at'], name='job_settled_idx'),
        ),
    ]
