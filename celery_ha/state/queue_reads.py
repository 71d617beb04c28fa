"""The reading half of :class:`celery_ha.state.taskqueue.TaskQueue`: snapshots, checkpoints, counts and
the dead-letter list, over every shard of the namespace. A base class of its own module, so the
transitions module stays small; it writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from celery_ha.base.validation import MAX_NAME_CHARS, check_int, check_text, iter_many
from celery_ha.state.counts import ready_ids
from celery_ha.state.keys import QueueKeys
from celery_ha.state.records import TaskInfo
from celery_ha.state.replies import Refusal, raise_for
from celery_ha.state.run_sum import take_items_sum
from celery_ha.state.sharded import dead_page, records, summed_stats
from celery_ha.state.shards import check_count, shard_of


def _task_id(task_id: Any) -> str:
    """A task id as a caller passes it: a short clean string (an unknown one is not an error here)."""
    return check_text("task id", task_id, MAX_NAME_CHARS)


class QueueReads:
    """Reads of one namespace (every shard); :class:`TaskQueue` sets the attributes below."""

    client: redis.Redis
    namespace: str
    shard_count: int
    _shards: list[QueueKeys]
    _layout_checked: bool

    def _of(self, task_id: str) -> int:
        return shard_of(task_id, self.shard_count)

    def shard_keys(self) -> list[QueueKeys]:
        """The keys of every shard, shard 0 (the namespace's own keys, ``self.keys``) first."""
        return list(self._shards)

    def _ensure_layout(self) -> None:
        """Check the configured shard count against the namespace's, once, at the first call (building
        a queue never touches Redis)."""
        if not self._layout_checked:
            check_count(self.client, self.namespace, self.shard_count)
            self._layout_checked = True

    def dead(self, limit: int = 100, offset: int = 0) -> list[TaskInfo]:
        """Dead tasks, oldest death first."""
        limit = check_int("limit", limit, 0, 1_000_000)
        offset = check_int("offset", offset, 0, 2**62)
        if limit == 0:
            return []
        self._ensure_layout()
        ids = dead_page(self.client, self._shards, offset, limit)
        return [t for t in self._infos(ids) if t is not None]

    def _infos(self, ids: list[str]) -> list[TaskInfo | None]:
        if not ids:
            return []
        self._ensure_layout()
        raws = records(self.client, self._shards, ids)
        return [TaskInfo.parse(i, raw) if raw else None for i, raw in zip(ids, raws, strict=True)]

    def get_many(self, task_ids: list[str]) -> list[TaskInfo | None]:
        """Snapshots of many tasks in one round trip (None for unknown or trimmed ids)."""
        return self._infos([_task_id(i) for i in iter_many("task ids", task_ids)])

    def get(self, task_id: str) -> TaskInfo:
        """Snapshot of one task; TaskNotFound if the id is unknown (or its history was trimmed)."""
        info = self._infos([_task_id(task_id)])[0]
        if info is None:
            raise_for(Refusal.UNKNOWN, task_id, namespace=self.namespace)
        return info

    def checkpoint(self, task_id: str) -> dict[str, Any] | None:
        """The task's saved resume point, or None (never saved, or dropped when the task completed)."""
        task_id = _task_id(task_id)
        self._ensure_layout()
        raw = self.client.hget(self._shards[self._of(task_id)].checkpoints, task_id)
        if not raw:
            return None
        checkpoint = json.loads(raw)
        take_items_sum(checkpoint)  # the run's reserved field (state/run_sum.py): not the task's
        return checkpoint

    def stats(self) -> dict[str, int]:
        """Counts per state plus lifetime counters, read in two round trips."""
        self._ensure_layout()
        return summed_stats(self.client, self._shards)

    def ready_ids(self) -> list[str]:
        """Every queued id in claim order (for tests and tooling; O(queued))."""
        self._ensure_layout()
        return [tid for k in self._shards for tid in ready_ids(self.client, k)]
