from django.db import models


class Order(models.Model):
    """What the view saves in the same transaction as it enqueues."""

    url = models.URLField(max_length=2000)
