"""A worker still serving a migrated namespace by name drops the messages that were waiting in its broker
queue once each, and then sends nothing of it again: its pump (the watchdog's sweep, every
``CELERY_HA_REDISPATCH_AFTER``) no longer re-sends the source's dispatched tasks only for their claims
to refuse them (``integration/dispatch/pump.py`` reads the migration marks with the pause flag)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

from celery_ha.integration.dispatch.pump import pump
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.sink import count_items
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow

TASKS = 12


def _waiting(cluster: Any) -> int:
    """Messages in the source's broker queue, over kombu's priority lists."""
    return sum(cluster.broker.llen(k) for k in cluster.broker.keys(cluster.crawl_queue + "*"))


def test_a_migrated_namespace_served_by_name_is_pumped_no_more(make_cluster: Any) -> None:
    prefix = f"q{uuid.uuid4().hex[:8]}"
    src, dst = f"{prefix}-src", f"{prefix}-dst"
    # A short redispatch delay: every sweep of the old namespace finds its dispatched tasks overdue.
    cluster = make_cluster(namespace=src, CELERY_HA_REDISPATCH_AFTER="1",
                           CELERY_HA_EXTRA_IMPORTS="tests.support.celery_tasks,tests.chaos.migrate_tasks")
    source = TaskQueue(cluster.r, src)
    source.enqueue_many([f"http://h{i % 3}.example/p/{i}" for i in range(TASKS)], task="test_migrated_item")
    assert pump(source, cluster.app, cluster.settings(), TASKS) == TASKS
    cli = [sys.executable, "-m", "celery_ha.cli", "--redis-url", cluster.state_url, "-n", src]
    migrated = subprocess.run([*cli, "migrate", dst, "--shards", "1", "--yes"], capture_output=True,
                              text=True, timeout=120, check=False)
    assert migrated.returncode == 0, migrated.stderr

    late = cluster.worker("late")  # no beat: its watchdog sweeps the old namespace every few seconds
    said = f"was migrated to '{dst}' (celery-ha migrate): message dropped"
    wait_for(lambda: cluster.log_text(late).count(said) == TASKS, timeout=60, interval=0.2,
             message="the worker to drop each message that was waiting")
    dropped_at = redis_now_ms(cluster.r)
    meta = QueueKeys(src).meta

    def swept_since(ms: int) -> bool:
        last = cluster.r.hget(meta, "last_sweep")
        return last is not None and int(last) > ms

    # Two sweeps of the watchdog, the first past the redispatch delay: each found every dispatched task
    # overdue, and re-sent it before the fix.
    wait_for(lambda: swept_since(dropped_at + 1500), timeout=60, interval=0.2, message="a sweep")
    first = int(cluster.r.hget(meta, "last_sweep"))
    wait_for(lambda: swept_since(first), timeout=60, interval=0.2, message="a second sweep")
    assert int(source.stats().get("redispatched", 0)) == 0
    assert _waiting(cluster) == 0
    assert cluster.log_text(late).count(said) == TASKS
    assert source.stats()["claimed"] == 0 and count_items(cluster.r, src) == 0
    assert "nothing of it is dispatched or sent again here" in cluster.log_text(late)
