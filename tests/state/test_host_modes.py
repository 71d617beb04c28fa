"""The host gate's key mode (``HostGate.set_mode``, hcfg ``km``) against a real Redis: how a task that
gives no ``host=`` gets its host key (its URL's host, its registered domain, or none), kept in Redis so
every process of the namespace agrees, and enqueue's check that the keys it sends were made under the
mode in force. Tests assert what Redis holds and what the queue hands out."""

from __future__ import annotations

import pytest
import redis

from celery_ha import InvalidInput, TaskQueue
from celery_ha.base.hosts import registered_domain
from celery_ha.state.host_queues import host_queue_ids
from tests.support.invariants import check_invariants


@pytest.fixture
def gq(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30, host_gate=True)


def claim_all(queue: TaskQueue) -> list:
    out = []
    while (lease := queue.claim_next("w")) is not None:
        out.append(lease)
    return out


@pytest.mark.parametrize(("key", "domain"), [
    ("a.example.test", "example.test"),  # no listed suffix: the list's default rule '*'
    ("www.bbc.co.uk", "bbc.co.uk"),
    ("a.b.example.com:8080", "example.com:8080"),
    ("example.com", "example.com"),
    ("127.0.0.7", "127.0.0.7"),
    ("localhost", "localhost"),
    ("site-42", "site-42"),
    ("x.github.io", "github.io"),  # ICANN suffixes only: one operator's servers, one gate
])
def test_registered_domain_follows_the_bundled_public_suffix_list(key: str, domain: str) -> None:
    assert registered_domain(key) == domain


def test_the_mode_is_host_until_set_and_a_bad_one_is_a_one_line_error(gq: TaskQueue, r: redis.Redis) -> None:
    assert gq.hosts.mode() == "host"
    with pytest.raises(InvalidInput, match="host key mode must be one of"):
        gq.hosts.set_mode("subdomain")
    assert gq.hosts.set_mode("domain") == "registered-domain"
    assert r.hget(gq.keys.prefix + "hcfg", "km") == "registered-domain"


def test_registered_domain_mode_puts_subdomains_behind_one_gate(gq: TaskQueue, r: redis.Redis) -> None:
    gq.hosts.set_mode("registered-domain")
    gq.hosts.set("example.test", concurrency=1)
    a = gq.enqueue("http://a.example.test/1")
    b = gq.enqueue("http://b.example.test/2")
    other = gq.enqueue("http://c.other.test/3")
    own = gq.enqueue("http://d.example.test/4", host="d.example.test")  # host= wins in every mode
    assert [gq.get(t).host for t in (a, b, other, own)] == [
        "example.test", "example.test", "other.test", "d.example.test"]
    assert host_queue_ids(r, gq.keys, "example.test") == [a, b]
    # One slot for the whole domain: a and b never run at once.
    leases = claim_all(gq)
    assert sorted(lease.task_id for lease in leases) == sorted([a, other, own])
    check_invariants(r, gq)
    gq.complete(next(lease for lease in leases if lease.task_id == a))
    assert [lease.task_id for lease in claim_all(gq)] == [b]
    # Blocking a subdomain by name holds back the gate it stands for.
    gq.hosts.block("www.example.test", 60)
    assert gq.hosts.get("example.test").blocked_until is not None
    assert gq.hosts.key_of_url("https://z.example.test/p") == "example.test"


def test_custom_mode_gates_only_tasks_given_a_key(gq: TaskQueue, r: redis.Redis) -> None:
    gq.hosts.set_mode("custom")
    plain = gq.enqueue("http://a.example/1")
    keyed = gq.enqueue("http://a.example/2", host="tenant-9")
    assert gq.get(plain).host is None and gq.get(keyed).host == "tenant-9"
    assert r.lrange(gq.keys.ready_list(0), 0, -1) == [plain]
    assert gq.hosts.key_of_url("http://a.example/3") == ""
    check_invariants(r, gq)


def test_a_process_that_read_an_old_mode_makes_its_keys_again(redis_url: str, r: redis.Redis) -> None:
    writer = TaskQueue.from_url(redis_url, host_gate=True)
    operator = TaskQueue.from_url(redis_url)
    assert writer.enqueue("http://a.example.test/0") and writer.hosts.mode() == "host"  # cached: host
    operator.hosts.set_mode("registered-domain")
    # The writer still holds 'host'; enqueue.lua refuses those keys, and the writer makes them again.
    ids = writer.enqueue_many([f"http://s{i}.example.test/p" for i in range(5)], batch_size=2)
    assert {writer.get(t).host for t in ids} == {"example.test"}
    assert writer._key_mode == "registered-domain"
    assert len(host_queue_ids(r, writer.keys, "example.test")) == 5
    check_invariants(r, writer)


def test_a_sharded_namespace_places_a_domain_on_one_shard(redis_url: str, r: redis.Redis) -> None:
    sq = TaskQueue.from_url(redis_url, namespace="shmode", shards=4, host_gate=True)
    sq.hosts.set_mode("registered-domain")
    ids = sq.enqueue_many([f"http://h{i}.example.test/p" for i in range(12)])
    shard = sq._shards[sq.hosts._shard("example.test")]
    assert sorted(host_queue_ids(r, shard, "example.test")) == sorted(ids)
    assert len(claim_all(sq)) == 12


@pytest.mark.parametrize("shards", [1, 3])
def test_keys_made_again_keep_their_dedup_ids_on_every_shard(redis_url: str, r: redis.Redis,
                                                              shards: int) -> None:
    """A fresh process (mode 'host' until it reads one) enqueues URLs of a 'registered-domain'
    namespace: the refused keys are made again, dedup ids stay dedup ids (a URL queued before is a
    duplicate under the same id), and rows of the batch bound for other shards are keyed again too."""
    first = TaskQueue.from_url(redis_url, namespace="km", shards=shards, host_gate=True)
    first.hosts.set_mode("registered-domain")
    urls = [f"http://s{i}.site{i % 4}.test/p" for i in range(12)]
    before = first.enqueue_many(urls[:6])
    fresh = TaskQueue.from_url(redis_url, namespace="km", shards=shards, host_gate=True)
    status = fresh.enqueue_many_with_status(urls, batch_size=5)
    assert [tid for tid, _ in status[:6]] == before and [new for _, new in status] == [False] * 6 + [True] * 6
    assert {fresh.get(t).host for t, _ in status} == {f"site{i}.test" for i in range(4)}
    for tid, _ in status:
        host = fresh.get(tid).host
        assert tid in host_queue_ids(r, fresh._shards[fresh.hosts._shard(host)], host)
    assert len(claim_all(fresh)) == 12
    check_invariants(r, fresh)


def test_keys_made_again_under_custom_mode_give_the_plain_id(redis_url: str, r: redis.Redis) -> None:
    """A fresh process (mode 'host') enqueues into a sharded 'custom' namespace: the URL makes no key
    any more, so its id is the plain digest, the one a process that knows the mode computes."""
    knows = TaskQueue.from_url(redis_url, namespace="cu", shards=3, host_gate=True)
    knows.hosts.set_mode("custom")
    url = next(f"http://w{i}.example/p" for i in range(1000)
               if knows.task_ids([f"http://w{i}.example/p"])[0]
               != TaskQueue.from_url(redis_url, namespace="cu", shards=3, host_gate=True).task_ids(
                   [f"http://w{i}.example/p"])[0])
    fresh = TaskQueue.from_url(redis_url, namespace="cu", shards=3, host_gate=True)
    (tid, new), = fresh.enqueue_many_with_status([url])
    assert new is True and tid == knows.task_ids([url])[0]
    assert knows.enqueue_many_with_status([url]) == [(tid, False)]
