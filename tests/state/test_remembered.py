"""The compact memory of finished dedup ids (``_remembered.lua``): exact (no id is taken for another),
its times coarse to the hour (exact while the history holds the record), forgotten by the sweep in
bounded passes, and the sorted set `done` of the layout before honoured, then moved."""

from __future__ import annotations

import redis

from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.done_times import (
    DONE_EPOCH_MS,
    HOUR_MS,
    count_remembered,
    done_slot,
    finished_at,
    hour_ms,
    remembered,
)
from celery_ha.state.replay import enqueue_if_absent
from tests.support.invariants import check_invariants
from tests.support.records import record_count

URL = "https://example.com/r/{}"


def _finish(q: TaskQueue, urls: list[str]) -> list[str]:
    ids = q.enqueue_many(urls)
    for tid in ids:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.complete(lease)
    return ids


def _hour(ms: int) -> int:
    return (ms - DONE_EPOCH_MS) // HOUR_MS


def _marked_buckets(r: redis.Redis, q: TaskQueue) -> tuple[int, set[str]]:
    """(bits set in the bitmap of buckets, the buckets that hold ids): every one of them is marked."""
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    held = {key for key in r.scan_iter(match=q.keys.prefix + "d:*") if not key.endswith("~")}
    for key in held:
        c1, c2, h = (alphabet.index(c) for c in key[-3:])
        assert r.getbit(q.keys.prefix + "dk", (c1 * 62 + c2) * 31 + h) == 1, key
    return int(r.bitcount(q.keys.prefix + "dk")), held


def _set_hour(raw: redis.Redis, q: TaskQueue, tid: str, hour: int) -> None:
    """Rewrite the completion hour of a remembered id (its field must exist: the count stays right)."""
    key, field = done_slot(q._shards[q._of(tid)].prefix, tid)
    assert raw.hset(key, field, hour) == 0


def test_finished_ids_are_remembered_in_their_buckets_with_the_hour(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rm", history_max=0)
    raw = redis.Redis.from_url(redis_url)  # bucket fields are bytes
    before = _hour(redis_now_ms(r))
    urls = [URL.format(n) for n in range(300)]
    ids = _finish(q, urls)
    after = _hour(redis_now_ms(r))
    assert q.stats()["remembered"] == 300 == count_remembered(r, q.keys)
    marked, held = _marked_buckets(r, q)
    assert marked == len(held) > 200
    for tid in ids:
        assert before <= int(raw.hget(*done_slot(q.keys.prefix, tid))) <= after
    assert not r.exists(q.keys.done) and record_count(r, q.keys) == 0  # no sorted set, no record
    assert all(bucket.startswith(q.keys.prefix + "d:") and len(bucket) == len(q.keys.prefix) + 5
               for bucket in r.scan_iter(match=q.keys.prefix + "d:*"))
    assert not any(created for _, created in q.enqueue_many_with_status(urls))
    others = [URL.format(n) for n in range(300, 2300)]
    assert all(created for _, created in q.enqueue_many_with_status(others))
    check_invariants(r, q)


def test_an_id_is_never_taken_for_a_neighbour(redis_url: str, r: redis.Redis) -> None:
    """Ids one character apart (the same bucket or not; the third character's low bit is the one the
    bucket name leaves to the field), extreme ids and an id of another shape: only the finished one is
    remembered, and the sweep's decoding of the fields gives each id back (it keeps the ones the
    history holds)."""
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "nb", dedup_ttl=0)
    base = "aB3xYz09QrSt"
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    neighbours = {base[:j] + alphabet[alphabet.index(base[j]) - 1] + base[j + 1:] for j in range(12)}
    finished = [base, "zzzzzzzzzzzz", "000000000000", "Z9z9Z9z9Z9z9", "custom-id:1"]
    assert enqueue_if_absent(q, [(tid, URL.format(tid)) for tid in finished]) == [True] * 5
    for tid in finished:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.complete(lease)
    assert all(remembered(r, q.keys, tid) for tid in finished)
    assert not any(remembered(r, q.keys, tid) for tid in neighbours)
    assert enqueue_if_absent(q, [(tid, URL.format(tid)) for tid in sorted(neighbours)]) == [True] * 12
    assert enqueue_if_absent(q, [(tid, URL.format(tid)) for tid in finished]) == [False] * 5
    # TTL 0: every finished id is old enough, but the history holds all five records.
    assert q.forget_finished() == 0 and count_remembered(r, q.keys) == 5
    r.delete(q.keys.completed)  # the history lets go of them
    assert q.forget_finished() == 5
    assert count_remembered(r, q.keys) == 0 and q.stats()["remembered"] == 0
    assert _marked_buckets(r, q) == (0, set())  # the pass cleared the bits of the buckets it emptied


def test_the_recrawl_window_counts_from_the_start_of_the_hour_once_the_record_is_gone(
        redis_url: str, r: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    raw = redis.Redis.from_url(redis_url)
    kept = TaskQueue(client, "rw")  # the history holds the record: its exact time decides
    (tid,) = _finish(kept, [URL.format(0)])
    _set_hour(raw, kept, tid, _hour(redis_now_ms(r)) - 1)
    assert kept.enqueue_many_with_status([URL.format(0)], recrawl_after=60) == [(tid, False)]
    now = redis_now_ms(r)
    assert finished_at(client, "rw", 1, [tid]) == [round(kept.get(tid).updated_at * 1000)]
    assert now - 60_000 < finished_at(client, "rw", 1, [tid])[0] <= now
    gone = TaskQueue(client, "rg", history_max=0)  # no record: the hour's start decides
    (tid,) = _finish(gone, [URL.format(0)])
    now_h = _hour(redis_now_ms(r))
    _set_hour(raw, gone, tid, now_h - 3)  # 3 h ago, plus the minutes of this hour
    assert finished_at(client, "rg", 1, [tid]) == [hour_ms(now_h - 3)]
    assert gone.enqueue_many_with_status([URL.format(0)], recrawl_after="4h") == [(tid, False)]
    assert gone.enqueue_many_with_status([URL.format(0)], recrawl_after="3h") == [(tid, True)]
    assert not remembered(r, gone.keys, tid) and gone.stats()["remembered"] == 0
    check_invariants(r, gone)


def test_the_sweep_forgets_by_the_hour_in_bounded_passes(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "tt", history_max=0,
                  dedup_ttl="5h")
    raw = redis.Redis.from_url(redis_url)
    urls = [URL.format(n) for n in range(40)]
    ids = _finish(q, urls)
    now_h = _hour(redis_now_ms(r))
    for tid in ids[:25]:
        _set_hour(raw, q, tid, now_h - 6)  # past the TTL
    first = q.forget_finished(batch=1, max_batches=1)
    assert first <= 1
    assert "dcur" in r.hgetall(q.keys.stats)  # a pass under way, carried to the next call
    assert q.stats().keys().isdisjoint({"dcur", "dpmin", "dmin"})
    total = first
    while "dcur" in r.hgetall(q.keys.stats):
        total += q.forget_finished(batch=5, max_batches=3)
    assert total == 25 and count_remembered(r, q.keys) == 15 == q.stats()["remembered"]
    assert not any(remembered(r, q.keys, tid) for tid in ids[:25])
    assert int(r.hget(q.keys.stats, "dmin")) >= now_h  # what the pass kept is recent
    marked, held = _marked_buckets(r, q)
    assert marked == len(held) > 0
    # Nothing left can be past the TTL: the next sweep reads no bucket.
    r.config_resetstat()
    assert q.forget_finished() == 0
    assert "cmdstat_hgetall" not in r.info("commandstats")
    # An old id moved from the layout before lowers the bound: the same call forgets it.
    r.zadd(q.keys.done, {"oldoldoldold": redis_now_ms(r) - 10 * HOUR_MS})
    assert q.forget_finished() == 2  # moved, then forgotten
    assert not r.exists(q.keys.done) and count_remembered(r, q.keys) == 15
    assert [created for _, created in q.enqueue_many_with_status(urls)] == [True] * 25 + [False] * 15
    check_invariants(r, q)



def test_ids_the_history_keeps_past_the_ttl_are_looked_at_once_an_hour_not_at_every_sweep(
        redis_url: str, r: redis.Redis) -> None:
    """A completed history longer than the dedup TTL keeps ids past it (their records say finished):
    the pass that kept them is followed by sweeps that read no bucket until the next hour, when a
    pass forgets those the history let go meanwhile."""
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "hk", history_max=10,
                  dedup_ttl="2h")
    raw = redis.Redis.from_url(redis_url)
    ids = _finish(q, [URL.format(n) for n in range(6)])  # all six in the history (history_max=10)
    now_h = _hour(redis_now_ms(r))
    for tid in ids:
        _set_hour(raw, q, tid, now_h - 3)  # past the TTL
    assert q.forget_finished() == 0  # a pass: every one kept, the history holds their records
    r.config_resetstat()
    assert q.forget_finished() == 0 and q.forget_finished() == 0
    assert "cmdstat_hgetall" not in r.info("commandstats")  # no pass until the next hour
    r.zrem(q.keys.completed, *ids[:4])  # the history lets four go (its trim, as time would)
    r.hset(q.keys.stats, "dkat", now_h - 1)  # the pass that kept them was an hour ago
    assert q.forget_finished() == 4
    assert [remembered(r, q.keys, tid) for tid in ids] == [False] * 4 + [True] * 2
    assert q.stats().keys().isdisjoint({"dkmin", "dkat", "dpkmin"})

def test_the_sorted_set_of_the_layout_before_is_honoured_then_moved(redis_url: str, r: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = TaskQueue(client, "mg", history_max=0)
    urls = [URL.format(n) for n in range(30)]
    ids = q.task_ids(urls)
    now = redis_now_ms(r)
    (late,) = _finish(q, [URL.format(99)])  # finished after the upgrade, and in the old set too:
    scores = {tid: now - 2 * HOUR_MS for tid in ids[:10]} | {tid: now for tid in ids[10:]} | {late: 5}
    r.zadd(q.keys.done, scores)
    assert finished_at(client, "mg", 1, ids) == [int(scores[t]) for t in ids]  # exact, from the set
    assert not any(created for _, created in q.enqueue_many_with_status(urls))
    assert q.forget_finished(batch=7) == 31  # no TTL: only moved, in bounded calls
    assert not r.exists(q.keys.done)
    assert count_remembered(r, q.keys) == 31 == q.stats()["remembered"]
    assert finished_at(client, "mg", 1, ids) == [hour_ms(_hour(int(scores[t]))) for t in ids]
    assert finished_at(client, "mg", 1, [late])[0] >= hour_ms(_hour(now))  # the buckets' time kept
    assert not any(created for _, created in q.enqueue_many_with_status(urls))
    assert [c for _, c in q.enqueue_many_with_status(urls, recrawl_after="1h")] == [True] * 10 + [False] * 20
    check_invariants(r, q)


def test_a_sharded_namespace_remembers_each_id_on_its_shard(redis_url: str, r: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = TaskQueue(client, "shd", shards=3, history_max=0, dedup_ttl="2h")
    raw = redis.Redis.from_url(redis_url)
    urls = [URL.format(n) for n in range(24)]
    ids = _finish(q, urls)
    for tid in ids:
        mine = q._of(tid)
        assert [remembered(r, k, tid) for k in q._shards] == [s == mine for s in range(3)]
    assert q.stats()["remembered"] == 24 and sum(count_remembered(r, k) for k in q._shards) == 24
    assert all(at is not None for at in finished_at(client, "shd", 3, ids))
    now_h = _hour(redis_now_ms(r))
    for tid in ids[:9]:
        _set_hour(raw, q, tid, now_h - 3)
    assert q.forget_finished() == 9
    assert q.stats()["remembered"] == 15
    assert [c for _, c in q.enqueue_many_with_status(urls)] == [True] * 9 + [False] * 15
