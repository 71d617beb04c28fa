"""Check DESIGN §2's invariants directly on Redis state (used by unit, stateful and chaos tests)."""

from __future__ import annotations

import json
from collections import Counter

import redis

from celery_ha.state import TaskQueue

#: state code -> the structure that must hold the id
_STRUCTURE_OF = {"q": "ready", "d": "inflight", "r": "running", "w": "delayed", "x": "dead", "c": "completed"}


def membership(r: redis.Redis, q: TaskQueue) -> dict[str, list[str]]:
    """Every state structure's ids (ready lists flattened in claim order)."""
    k = q.keys
    out = {"ready": []}  # type: dict[str, list[str]]
    for band in r.zrange(k.ready_bands, 0, -1):
        out["ready"].extend(r.lrange(k.ready_list(band), 0, -1))
    for name, key in (("inflight", k.inflight), ("running", k.running), ("delayed", k.delayed),
                      ("dead", k.dead), ("completed", k.completed)):
        out[name] = r.zrange(key, 0, -1)
    return out


def check_invariants(r: redis.Redis, q: TaskQueue) -> dict[str, str]:
    """Assert that every task is in exactly one structure, the one its record names; return id->state."""
    where = membership(r, q)
    seen: Counter[str] = Counter()
    location: dict[str, str] = {}
    for name, ids in where.items():
        for tid in ids:
            seen[tid] += 1
            location[tid] = name
    doubled = {tid: n for tid, n in seen.items() if n > 1}
    assert not doubled, f"ids in more than one place: {doubled}"
    states: dict[str, str] = {}
    for tid, raw in r.hgetall(q.keys.tasks).items():
        st = json.loads(raw.partition("\n")[0])
        expected = _STRUCTURE_OF[st["s"]]
        assert location.get(tid) == expected, f"{tid} is {st['s']!r} but sits in {location.get(tid)!r}"
        states[tid] = st["s"]
    orphans = set(location) - set(states)
    assert not orphans, f"ids without a record: {orphans}"
    # Every non-empty band is indexed (an emptied band may stay indexed until the next pop).
    indexed = set(r.zrange(q.keys.ready_bands, 0, -1))
    for key in r.scan_iter(match=q.keys.ready_list("*"), count=1000):
        band = key[len(q.keys.ready_list("")):]
        assert band in indexed, f"band {band} holds tasks but is not indexed"
    return states
