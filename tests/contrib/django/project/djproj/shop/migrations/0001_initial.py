"""The test project's one model."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = ()

    operations = (
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("url", models.URLField(max_length=2000)),
            ],
        ),
    )
