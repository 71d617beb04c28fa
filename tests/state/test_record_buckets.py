"""Where task records live (``_records.lua``): small hashes t:<i> whose count grows with the records
(linear hashing), so no write pays for rehashing one namespace-wide table; and the one hash of earlier
releases, read until each of its records is written again, so a live namespace changes layout as it
runs."""

from __future__ import annotations

import redis

from celery_ha.state import TaskQueue
from celery_ha.state.record_store import all_records, bucket_count, read_records
from celery_ha.state.records import decode_head
from celery_ha.state.replay import enqueue_if_absent
from tests.support.invariants import check_invariants
from tests.support.records import drop_records, put_raw_record, raw_record, record_count

URL = "https://example.com/b/{}"
LOAD = 16  # REC_LOAD of _records.lua


def _bucket_sizes(r: redis.Redis, q: TaskQueue) -> list[int]:
    return [int(r.hlen(q.keys.record_bucket(i))) for i in range(bucket_count(r, q.keys))]


def test_records_spread_over_buckets_that_split_as_they_grow(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "grow", history_max=100)
    ids = q.enqueue_many([URL.format(i) for i in range(20_000)])
    odd = [f"order-{i}/x" for i in range(300)]  # ids of the caller's own shape: the other hash
    assert enqueue_if_absent(q, [(tid, URL.format(tid)) for tid in odd]) == [True] * 300
    total = 20_300
    assert not r.exists(q.keys.tasks)  # nothing in the one hash of earlier releases
    assert record_count(r, q.keys) == total
    sizes = _bucket_sizes(r, q)
    assert total / LOAD <= len(sizes) <= 2 * total / LOAD + 1, len(sizes)
    assert sum(sizes) == total and max(sizes) <= 5 * LOAD, max(sizes)
    raws = read_records(r, q.keys, ids + odd)
    assert all(raws) and len(raws) == total
    assert len(dict(all_records(r, q.keys))) == total
    check_invariants(r, q)
    # Finishing tasks lets the bounded history delete records: the count follows, every read holds.
    for _ in range(2_000):
        lease = q.claim_next("w:1")
        assert lease is not None
        q.complete(lease)
    left = record_count(r, q.keys)
    assert total - 2_000 < left <= total - 2_000 + 200, left
    assert sum(_bucket_sizes(r, q)) == left
    assert q.stats()["queued"] == total - 2_000
    check_invariants(r, q)


def test_records_of_the_one_hash_of_earlier_releases_are_read_and_move_at_their_next_write(
        redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "old")
    urls = [URL.format(i) for i in range(600)]
    ids = q.enqueue_many(urls)
    # The layout an earlier release left: every record in the one hash `tasks`, no bucket.
    old = dict(all_records(r, q.keys))
    drop_records(r, q.keys)
    r.hset(q.keys.tasks, mapping=old)
    assert record_count(r, q.keys) == 600 and q.get(ids[7]).state == "queued"
    # A duplicate is told from the old record; nothing is written twice.
    assert [created for _, created in q.enqueue_many_with_status(urls[:50])] == [False] * 50
    for _ in range(250):
        lease = q.claim_next("w:1")
        assert lease is not None
        q.complete(lease)
    # Each record written since lives in its bucket, and only there (check_invariants: one place).
    assert int(r.hlen(q.keys.tasks)) == 350 and record_count(r, q.keys) == 600
    check_invariants(r, q)
    while (lease := q.claim_next("w:1")) is not None:
        q.complete(lease)
    assert not r.exists(q.keys.tasks)  # drained: the earlier layout is gone
    assert {q.get(tid).state for tid in ids} == {"completed"}
    assert q.stats()["completed"] == 600
    check_invariants(r, q)


def test_a_bucket_is_one_compact_listpack_when_the_server_allows_its_records(
        redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "compact")
    r.config_set("hash-max-ziplist-value", 1024)  # the fixture's own server; README "Limits"
    try:
        q.enqueue_many([URL.format(i) for i in range(3_000)])
        encodings = {r.object("encoding", q.keys.record_bucket(i)) for i in range(bucket_count(r, q.keys))}
    finally:
        r.config_set("hash-max-ziplist-value", 64)
    assert encodings <= {"listpack", "ziplist"}, encodings


def test_a_record_leaves_out_what_is_at_its_default_and_reads_back_whole(redis_url: str,
                                                                         r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "lean")
    plain = q.enqueue("https://example.com/lean/1")
    raw = raw_record(r, q.keys, plain)
    head, _, body = raw.partition("\n")
    assert body == "//example.com/lean/1"  # the URL alone: bare, not {"u": ...}, https without its scheme
    st = decode_head(head)
    assert "n" not in st and "ma" not in st and "ms" not in st, head
    info = q.get(plain)
    assert (info.task, info.max_attempts, info.max_stalls, info.url) == \
        ("fetch_page", 3, 3, "https://example.com/lean/1")
    own = q.enqueue("https://example.com/lean/2?q=\"x\"", task="parse_list", meta={"d": 1},
                    max_attempts=5, max_stalls=0)
    info = q.get(own)
    assert (info.task, info.max_attempts, info.max_stalls, info.meta, info.url) == \
        ("parse_list", 5, 0, {"d": 1}, "https://example.com/lean/2?q=\"x\"")
    # Through a whole lifecycle the left-out fields stay out, and the task runs under its name.
    lease = q.claim(plain, "w:1")
    assert lease is not None and lease.task.task == "fetch_page"
    assert "n" not in decode_head(raw_record(r, q.keys, plain).partition("\n")[0])
    q.complete(lease)
    # A record of an earlier release, with every field written out, reads the same.
    old = '{"ms":"3","s":"q","ma":"3","ct":"1796407325451","n":"fetch_page"}\n{"u":"https://example.com/o"}'
    put_raw_record(r, q.keys, "OLDRECORD001", old)
    info = q.get("OLDRECORD001")
    assert (info.task, info.url, info.max_attempts, info.state) == ("fetch_page", "https://example.com/o", 3,
                                                                   "queued")


def test_short_lived_clients_that_read_records_are_freed_with_their_connections(redis_url: str,
                                                                                 r: redis.Redis) -> None:
    """A CLI call or a web request makes its own client and reads a record: once it is gone, so is its
    connection (a cache keyed by the client that held its reader kept every one for good)."""
    import gc

    from celery_ha.redisio.client import redis_client
    from celery_ha.state.keys import QueueKeys
    from celery_ha.state.record_store import read_record

    def connected() -> int:
        return int(r.info("clients")["connected_clients"])

    before = connected()
    for i in range(30):
        client = redis_client(redis_url)
        assert read_record(client, QueueKeys("short"), f"t{i}") is None
        del client
    gc.collect()
    assert connected() <= before + 1
