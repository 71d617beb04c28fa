"""The outbox table (``celery_ha_outbox``), for Django 4.2 and later (tuples: Django copies them)."""

import uuid

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = ()

    operations = (
        migrations.CreateModel(
            name="OutboxEntry",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True,
                                        serialize=False)),
                ("created_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                ("namespace", models.CharField(max_length=64)),
                ("task_id", models.CharField(max_length=256)),
                ("spec", models.TextField()),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "outbox entry",
                "verbose_name_plural": "outbox entries",
                "db_table": "celery_ha_outbox",
                "ordering": ("created_at",),
            },
        ),
    )
