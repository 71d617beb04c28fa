"""The host gate's compact layout against a real Redis: a host's queue as lists (one per host and
band, ``_hosts.lua``), the stale entry a direct claim or a cancel leaves, a namespace whose host
queues an earlier release wrote as sorted sets (``hq:<host>``), drained first within their band while
new work goes to lists, and records that leave out the host key their URL names (``payload_host``).
Every test checks the gate's books against the records (``check_invariants``)."""

from __future__ import annotations

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.keys import QueueKeys
from tests.support.invariants import check_invariants
from tests.support.records import raw_record


@pytest.fixture
def gq(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30, host_gate=True)


def claimed_ids(gq: TaskQueue) -> list[str]:
    out = []
    while (lease := gq.claim_next("w")) is not None:
        out.append(lease.task_id)
    return out


def as_earlier_release(r: redis.Redis, k: QueueKeys, hosts: list[str]) -> None:
    """Rewrite the hosts' queues as an earlier release kept them: one sorted set per host, score =
    band * 1e12 + 5e11 + seq (FIFO within a band), no list layout marked in hcfg."""
    seq = 0
    for host in hosts:
        for band in r.zrange(k.host_bands(host), 0, -1):
            for tid in r.lrange(k.host_list(band, host), 0, -1):
                seq += 1
                r.zadd(k.host_queue(host), {tid: int(band) * 10**12 + 5 * 10**11 + seq})
            r.delete(k.host_list(band, host))
        r.delete(k.host_bands(host))
    r.hdel(k.host_config, "hl", "lq")
    r.hset(k.host_config, "seq", seq)


def test_a_host_queue_is_a_list_per_band_handed_out_best_band_first_then_oldest_first(
        gq: TaskQueue, r: redis.Redis) -> None:
    low = gq.enqueue_many([f"http://a.example/p/{i}" for i in range(300)])
    high = gq.enqueue_many([f"http://a.example/h/{i}" for i in range(2)], priority=5)
    k = gq.keys
    assert r.type(k.host_list(1000, "a.example")) == "list"
    assert r.lrange(k.host_list(1000, "a.example"), 0, -1) == low
    assert r.lrange(k.host_list(995, "a.example"), 0, -1) == high
    assert r.zrange(k.host_bands("a.example"), 0, -1) == ["995", "1000"]
    assert not r.exists(k.host_queue("a.example"))
    assert gq.hosts.get("a.example").queued == 302 and gq.stats()["queued"] == 302
    assert [gq.claim_next("w").task_id for _ in range(3)] == [*high, low[0]]
    assert r.zrange(k.host_bands("a.example"), 0, -1) == ["1000"]  # its emptied band left the index
    check_invariants(r, gq)
    assert claimed_ids(gq) == low[1:]
    assert not r.exists(k.host_bands("a.example"), k.host_list(1000, "a.example"))
    assert r.hget(k.host_config, "nq") == "0"
    check_invariants(r, gq)


def test_a_cancel_or_a_direct_claim_leaves_a_stale_entry_that_the_pop_skips(
        gq: TaskQueue, r: redis.Redis) -> None:
    ids = gq.enqueue_many([f"http://a.example/p/{i}" for i in range(5)])
    gq.cancel(ids[1], reason="not wanted")
    direct = gq.claim(ids[3], "w")
    assert direct is not None
    stats = gq.stats()
    assert stats["queued"] == 3 and stats["running"] == 1 and stats["dead"] == 1
    assert r.llen(gq.keys.host_list(1000, "a.example")) == 5  # the two stay until a pop meets them
    check_invariants(r, gq)
    assert claimed_ids(gq) == [ids[0], ids[2], ids[4]]
    assert not r.exists(gq.keys.host_list(1000, "a.example"))
    assert gq.stats()["queued"] == 0 and r.hget(gq.keys.host_config, "nq") == "0"
    gq.complete(direct)
    check_invariants(r, gq)


def test_the_host_queues_of_an_earlier_release_are_drained_first_within_their_band(
        gq: TaskQueue, r: redis.Redis) -> None:
    a_old = gq.enqueue_many([f"http://a.example/old/{i}" for i in range(4)])
    a_old_high = gq.enqueue("http://a.example/old/high", priority=5)
    b_old = gq.enqueue_many([f"http://b.example/old/{i}" for i in range(2)])
    as_earlier_release(r, gq.keys, ["a.example", "b.example"])
    assert r.type(gq.keys.host_queue("a.example")) == "zset"
    check_invariants(r, gq)
    # New work goes to lists; the earlier release's zsets are counted once, as they are left.
    a_new = gq.enqueue_many([f"http://a.example/new/{i}" for i in range(2)])
    a_new_top = gq.enqueue("http://a.example/new/top", priority=9)
    assert r.hget(gq.keys.host_config, "lq") == "7" and r.hget(gq.keys.host_config, "hl") == "1"
    assert r.llen(gq.keys.host_list(1000, "a.example")) == 2
    assert gq.stats()["queued"] == 10 and gq.hosts.get("a.example").queued == 8
    gq.cancel(a_old[2], reason="not wanted")  # out of the zset: counted down at once
    assert r.hget(gq.keys.host_config, "lq") == "6" and gq.stats()["queued"] == 9
    check_invariants(r, gq)
    order = claimed_ids(gq)
    assert [t for t in order if t in b_old] == b_old
    expected = [a_new_top, a_old_high, a_old[0], a_old[1], a_old[3], *a_new]
    assert [t for t in order if t not in b_old] == expected
    assert r.hget(gq.keys.host_config, "lq") == "0" and r.hget(gq.keys.host_config, "nq") == "0"
    assert not r.keys(gq.keys.prefix + "hq:*")
    check_invariants(r, gq)


TRICKY = ["http://a.example/x", "https://b.example/y?q=1", "http://c.example:8080/z", "https://d.example:8443/",
          "http://E.Example/Upper", "https://f.example?only=query", "http://g.example#frag",
          "https://h.example/p?u=http://other.example/", "http://xn--bcher-kva.example/",
          "https://i.example/s%20p", "https://j.example/\u00e9t\u00e9", "http://user@m.example/"]


def test_a_record_leaves_out_the_host_its_url_names_and_every_reader_gets_it_back(
        gq: TaskQueue, r: redis.Redis) -> None:
    ids = gq.enqueue_many(TRICKY)
    meta = gq.enqueue("http://k.example/m", meta={"depth": 2})  # a JSON payload keeps its host
    custom = gq.enqueue("http://l.example/c", host="site-7")  # a key the URL does not name
    hosts = {tid: gq.get(tid).host for tid in [*ids, meta, custom]}
    assert hosts[meta] == "k.example" and hosts[custom] == "site-7"
    assert all(hosts[tid] for tid in ids)
    heads = {tid: raw_record(r, gq.keys, tid).partition("\n")[0] for tid in [*ids, meta, custom]}
    marked = [tid for tid in ids if heads[tid].startswith("~")]
    assert len(marked) >= len(ids) - 3, heads  # the URLs whose host is their key as written
    for tid in marked:
        assert hosts[tid] not in heads[tid]  # ~20 bytes a record less
    assert hosts[meta] in heads[meta] and hosts[custom] in heads[custom]
    # The Lua side reads the host back: every task is handed out by its own host's queue, and the
    # records keep the mark through the claim and the completion.
    for host in set(hosts.values()):
        assert gq.hosts.get(host).queued == sum(h == host for h in hosts.values())
    check_invariants(r, gq)
    leases = {lease.task_id: lease for lease in iter(lambda: gq.claim_next("w"), None)}
    assert set(leases) == set(hosts) and all(leases[t].task.host == hosts[t] for t in leases)
    for tid in marked:
        assert raw_record(r, gq.keys, tid).startswith("~R")
        gq.complete(leases.pop(tid))
        assert raw_record(r, gq.keys, tid).startswith("~C") and gq.get(tid).host == hosts[tid]
        assert gq.hosts.get(hosts[tid]).done == 1
    for lease in leases.values():
        gq.complete(lease)
    check_invariants(r, gq)


def test_more_work_for_a_queued_host_files_it_again_only_when_its_best_band_improves(
        gq: TaskQueue, r: redis.Redis) -> None:
    """enqueue.lua leaves a host with queued work where it is filed unless the new work is of a
    better band: its place in hready (band, then serve order) and its wait in hwait must not move."""
    k = gq.keys
    gq.enqueue_many([f"http://a.example/p/{i}" for i in range(3)])
    gq.enqueue_many(["http://b.example/p/0"])
    gq.hosts.block("c.example", 60, reason="test")
    first_c = gq.enqueue_many(["http://c.example/p/0"])
    placed_a, waits_c = r.zscore(k.hosts_ready, "a.example"), r.zscore(k.hosts_wait, "c.example")
    assert placed_a // 10**12 == 1000 and waits_c is not None
    more = gq.enqueue_many([f"http://a.example/q/{i}" for i in range(3)] + ["http://c.example/p/1"])
    assert r.zscore(k.hosts_ready, "a.example") == placed_a
    assert r.zscore(k.hosts_wait, "c.example") == waits_c and r.zscore(k.hosts_ready, "c.example") is None
    urgent = gq.enqueue_many(["http://a.example/urgent", "http://c.example/urgent"], priority=5)
    assert r.zscore(k.hosts_ready, "a.example") // 10**12 == 995  # in front of b now
    assert r.zscore(k.hosts_wait, "c.example") == waits_c  # still blocked: its wait did not move
    assert set(gq.hosts.hosts()) == {"a.example", "b.example", "c.example"}
    check_invariants(r, gq)
    assert gq.claim_next("w").task_id == urgent[0]
    assert len(claimed_ids(gq)) == 6 + 1  # a's and b's, none of blocked c's
    gq.hosts.unblock("c.example")
    assert claimed_ids(gq) == [urgent[1], *first_c, more[3]]
    check_invariants(r, gq)
