"""After ``celery-ha migrate``, the old namespace runs nothing: the messages of its dispatched tasks,
still in its broker queue, start no task there (a worker that consumes them drops each, naming the
new namespace), a fleet of a pattern (``CELERY_HA_NAMESPACES``) serves the new namespace (registered
by the migration) and not the old one, and every task runs once, in the new namespace."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

from celery_ha.integration.dispatch.pump import pump
from celery_ha.state import TaskQueue
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow

TASKS = 30
WINDOW = 8


def _waiting(cluster: Any) -> int:
    """Messages in the source's broker queue, over kombu's priority lists."""
    return sum(cluster.broker.llen(k) for k in cluster.broker.keys(cluster.crawl_queue + "*"))


def test_a_migrated_source_runs_nothing_and_its_tasks_run_once_in_the_target(make_cluster: Any) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    src, dst, own = f"{prefix}-src", f"{prefix}-dst", f"{prefix}-own"
    cluster = make_cluster(namespace=src, CELERY_HA_SHARDS="2", CELERY_HA_REDISPATCH_AFTER="600",
                           CELERY_HA_EXTRA_IMPORTS="tests.support.celery_tasks,tests.chaos.migrate_tasks")
    source = TaskQueue(cluster.r, src, shards=2)
    source.enqueue_many([f"http://h{i % 3}.example/p/{i}" for i in range(TASKS)], task="test_migrated_item")
    assert pump(source, cluster.app, cluster.settings(), WINDOW) == WINDOW  # messages wait in the broker
    assert _waiting(cluster) == WINDOW

    cli = [sys.executable, "-m", "celery_ha.cli", "--redis-url", cluster.state_url, "-n", src]
    migrated = subprocess.run([*cli, "migrate", dst, "--shards", "2", "--yes"], capture_output=True,
                              text=True, timeout=120, check=False)
    assert migrated.returncode == 0, migrated.stderr
    target = TaskQueue(cluster.r, dst, shards=2)

    # A fleet of the pattern: finds the target by itself, leaves the source (and its messages) alone.
    fleet = cluster.worker("fleet", wait=False, CELERY_HA_NAMESPACE=own, CELERY_HA_NAMESPACES=f"{prefix}-*",
                           CELERY_HA_DISCOVERY_INTERVAL="0.5")
    wait_for(lambda: target.stats()["completed"] == TASKS, timeout=120, interval=0.2,
             message="the fleet to run every task in the target")
    runs = sorted(item["url"] for item in iter_items(cluster.r, dst))
    assert runs == sorted(set(runs)) and len(runs) == TASKS  # each task once
    assert source.stats()["claimed"] == 0 and count_items(cluster.r, src) == 0
    assert _waiting(cluster) == WINDOW
    assert f"not serving namespace '{src}'" in cluster.log_text(fleet)
    cluster.kill_group(fleet)

    # A worker still started for the old namespace by name consumes its messages and drops each.
    late = cluster.worker("late")
    said = f"was migrated to '{dst}' (celery-ha migrate): message dropped"
    wait_for(lambda: cluster.log_text(late).count(said) == WINDOW, timeout=60, interval=0.2,
             message="the old namespace's worker to drop every message it held")
    wait_for(lambda: _waiting(cluster) == 0, timeout=10, message="its queue empty")
    assert source.stats()["claimed"] == 0 and count_items(cluster.r, src) == 0
    assert count_items(cluster.r, dst) == TASKS
