"""The operator's bulk verbs (recrawl, redrive of every dead task) send short script calls: at most
``SCRIPT_BATCH`` ids per call, as enqueue does (README "Short scripts"). Recrawl used to send 10,000
ids per call (0.5 s of Redis for 20k completed tasks, every worker waiting), redrive 1,000."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from celery_ha.state.sharded import by_shard


def recorded(queue: TaskQueue, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], Any]]:
    """Every script call ``queue`` makes from now on, as (script, arguments, reply): its one door to
    its scripts, ``TaskQueue._run``, wrapped (each call still runs as it would)."""
    calls: list[tuple[str, tuple[Any, ...], Any]] = []
    run = queue._run

    def wrapped(script: str, *args: Any, **kw: Any) -> Any:
        reply = run(script, *args, **kw)
        calls.append((script, args, reply))
        return reply

    monkeypatch.setattr(queue, "_run", wrapped)
    return calls


def _finish(q: TaskQueue, n: int, *, dead: bool = False) -> list[str]:
    """Enqueue ``n`` URLs and take each to completed (or dead)."""
    ids = q.enqueue_many([f"https://s{i % 7}.example/p/{i}" for i in range(n)])
    for _ in range(n):
        lease = q.claim_next("w:1")
        assert lease is not None
        if dead:
            q.fail(lease, "boom", retry=False)
        else:
            q.complete(lease)
    return ids


@pytest.mark.parametrize("shards", [1, 3])
def test_recrawl_sends_at_most_a_script_batch_of_ids_per_call(redis_url: str, shards: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rb", shards=shards)
    n = 1_234
    ids = _finish(q, n)
    calls = recorded(q, monkeypatch)
    results = q.recrawl(ids)
    assert list(results.values()) == ["queued"] * n
    rows = [len(args) for script, args, _ in calls if script == "recrawl"]
    assert max(rows) <= SCRIPT_BATCH, rows
    per_shard = by_shard(ids, shards)
    assert len(rows) == sum(math.ceil(len(at) / SCRIPT_BATCH) for at in per_shard.values())  # full calls
    assert sum(rows) == n and q.stats()["queued"] == n


def test_redrive_all_moves_at_most_a_script_batch_per_call(redis_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rd")
    n = 333
    _finish(q, n, dead=True)
    calls = recorded(q, monkeypatch)
    assert q.redrive(None) == n
    redrives = [(args, reply) for script, args, reply in calls if script == "redrive"]
    assert all(int(args[1]) <= SCRIPT_BATCH for args, _ in redrives), [a for a, _ in redrives]
    moved = [int(reply) for _, reply in redrives]
    assert max(moved) <= SCRIPT_BATCH and sum(moved) == n
    assert len(redrives) == math.ceil(n / SCRIPT_BATCH)
    assert q.stats()["dead"] == 0 and q.stats()["queued"] == n
