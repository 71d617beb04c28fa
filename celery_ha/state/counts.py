"""How many tasks are in each state, and the lifetime counters: the reads behind ``TaskQueue.stats``.

Every count is one O(1) command (``ZCARD``/``LLEN``/``HGETALL`` of a small hash), pipelined, so a
stats call costs two round trips whatever the number of tasks.
"""

from __future__ import annotations

import redis

from celery_ha.state.keys import QueueKeys

#: Lifetime counters always present in ``stats()`` (0 until the first event), in display order.
COUNTERS = ("enqueued", "duplicates", "claimed", "failed", "retried", "reclaimed", "released",
            "redriven", "redispatched", "recrawled", "items", "items_duplicate")


def queue_stats(client: redis.Redis, k: QueueKeys) -> dict[str, int]:
    """Counts per state plus lifetime counters (see ``TaskQueue.stats``)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(k.ready_bands, 0, -1)
    for key in (k.inflight, k.running, k.delayed, k.dead, k.completed):
        pipe.zcard(key)
    pipe.hgetall(k.stats)
    bands, dispatched, running, delayed, dead, history, counters = pipe.execute()
    queued = 0
    if bands:
        pipe = client.pipeline(transaction=False)
        for band in bands:
            pipe.llen(k.ready_list(band))
        queued = sum(pipe.execute())
    out = {"queued": queued, "dispatched": dispatched, "running": running, "delayed": delayed,
           "dead": dead, "completed_history": history}
    counters = {name: int(v) for name, v in counters.items()}
    out["completed"] = counters.pop("completed", 0)
    for name in COUNTERS:
        out[name] = counters.pop(name, 0)
    out.update(counters)
    out.pop("died", None)
    return out


def ready_ids(client: redis.Redis, k: QueueKeys) -> list[str]:
    """Every queued id in claim order (for tests and tooling; O(queued))."""
    out: list[str] = []
    for band in client.zrange(k.ready_bands, 0, -1):
        out.extend(client.lrange(k.ready_list(band), 0, -1))
    return out
