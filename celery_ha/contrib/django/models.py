"""The transactional outbox: enqueue requests written in the caller's database transaction.

A row is written by ``enqueue_on_commit`` inside the transaction, so it exists exactly when the
transaction committed. After the commit it is pushed to Redis and deleted; a row left behind (Redis
down or frozen at that moment, the process killed between commit and push) is pushed later by the
relay (beat, or ``manage.py celery_ha relay``). The task id is fixed when the row is written, and a
push creates the task only if that id is absent, so pushing a row twice queues it once.

Task state itself lives in Redis, never in these tables.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


class OutboxEntry(models.Model):
    """One enqueue request waiting to reach Redis."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)  # known before INSERT
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    namespace = models.CharField(max_length=64)
    task_id = models.CharField(max_length=256)  # the id enqueue_on_commit returned
    spec = models.TextField()  # the validated spec as JSON: url, task, priority, meta, dedup, limits
    attempts = models.PositiveIntegerField(default=0)  # relays that could not push it
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "celery_ha_outbox"
        ordering = ("created_at",)
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox entries"

    def __str__(self) -> str:
        return f"{self.task_id} ({self.namespace})"
