"""A batch message's hard time limit releases only the lease of the pool process it killed.

billiard reports the hard time limit in the worker's main process before it kills the child, and
fast failover then releases the timed-out message's ids at once. Every id of a batch message is looked
at; one of them may be held by another pool process of the same node, alive and running it (a message
of that id re-sent after ``CELERY_HA_REDISPATCH_AFTER`` while it waited behind the hanging one): that
lease must be left alone, or the id runs twice at the same time."""

from __future__ import annotations

import itertools

import pytest

from tests.chaos.edge_tasks import runs_key
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow

#: Hard limit 6 s a task (soft 5.4 s), so 12 s for a message of two ids; the second id, waiting behind
#: a first one that hangs, is re-sent after 8 s and taken by the other pool process, where it runs
#: 5 s: it is running there when the batch's hard limit kills the first process at 12 s.
LIMITS = {"CELERY_HA_BATCH": "edge_timed=2", "CELERY_HA_TASK_TIME_LIMIT": "6",
          "CELERY_HA_REDISPATCH_AFTER": "8", "CELERY_HA_EXTRA_IMPORTS": "tests.chaos.edge_tasks"}


def _runs(cluster, task_id: str) -> list[tuple[int, float, float | None]]:
    """(pid, start, end or None) of each run of ``task_id``, as the task recorded them."""
    starts: dict[int, float] = {}
    runs: list[tuple[int, float, float | None]] = []
    for entry in cluster.r.lrange(runs_key(cluster.namespace, task_id), 0, -1):
        pid, what, at = entry.split()
        if what == "start":
            starts[int(pid)] = float(at)
        else:
            runs.append((int(pid), starts.pop(int(pid)), float(at)))
    runs.extend((pid, start, None) for pid, start in starts.items())
    return sorted(runs, key=lambda run: run[1])


def test_a_batch_hard_time_limit_leaves_a_siblings_lease_alone(make_cluster) -> None:
    cluster = make_cluster(**LIMITS)
    worker = cluster.worker("w1", concurrency=2)
    hung, waiting = cluster.q.enqueue_many([
        {"url": "http://edge.invalid/hang", "task": "edge_timed", "meta": {"hang": True}},
        {"url": "http://edge.invalid/sleep", "task": "edge_timed", "meta": {"sleep": 5}},
    ])
    cluster.pump()  # one message: [hung, waiting]
    first = wait_for(lambda: _runs(cluster, hung), message="the first id running")[0][0]
    # The second id waits behind it; re-sent after 8 s, the other pool process runs it.
    sibling = wait_for(lambda: [run for run in _runs(cluster, waiting) if run[0] != first], timeout=30,
                       message="the waiting id re-sent and running in the sibling")[0]
    # 12 s after the batch started its hard limit kills the first process; the hung id is released and
    # runs again (it hangs only once).
    wait_for(lambda: cluster.all_completed([hung, waiting]), timeout=60, message="both ids completed")
    runs = _runs(cluster, waiting)
    overlapping = [(a, b) for a, b in itertools.pairwise(runs) if a[2] is None or b[1] < a[2]]
    assert not overlapping, f"{waiting} ran twice at once: {runs} (sibling {sibling[0]})"
    info = cluster.q.get(waiting)
    assert info.stalls == 0, info
    assert cluster.q.get(hung).stalls == 1  # the timed-out process's own lease was released
    assert "hard time limit" in cluster.log_text(worker).lower()
