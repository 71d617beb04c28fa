"""complete_dispatch.lua with a push section: the refill's messages pushed onto lists by the script."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import InvalidInput, LeaseLost, TaskQueue
from celery_ha.state.list_push import ListPush, message_priority
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until
from tests.support.records import put_raw_record, raw_record

KEYS = tuple(f"out:{p}" for p in range(10))
#: A JSON message of every code, so what the script rendered can be read back.
TEMPLATE = ('{"id": "', "i", '", "name": "', "n", '", "priority": ', "p", ', "token": "', "x", '"}')


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30)


def _messages(client: redis.Redis, key: str) -> list[dict[str, object]]:
    return [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]  # LPUSH: oldest last


def test_the_refill_is_pushed_in_the_same_script_onto_the_list_of_its_priority(q: TaskQueue,
                                                                             r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first")
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(4)], priority=0)
    hot = q.enqueue("https://example.com/hot", priority=5, task="detail_page")
    lease = q.claim(first, "w")
    done = q.complete_and_push(lease, [("k", {"v": 1})], window=3, push=ListPush(KEYS, TEMPLATE))
    assert (done.added, done.to_send, done.pushed, done.push_error) == (1, [], 3, None)
    hot_messages, normal = _messages(r, KEYS[0]), _messages(r, KEYS[3])
    assert [(m["id"], m["name"], m["priority"]) for m in hot_messages] == [(hot, "detail_page", 0)]
    assert [(m["id"], m["name"], m["priority"]) for m in normal] == [(ids[0], "fetch_page", 3),
                                                                     (ids[1], "fetch_page", 3)]
    tokens = {m["token"] for m in hot_messages + normal}
    assert len(tokens) == 3  # one per message
    s = q.stats()
    assert (s["completed"], s["dispatched"], s["queued"]) == (1, 3, 2)
    assert q.get(ids[0]).state == "dispatched"
    check_invariants(r, q)


def test_each_call_has_its_own_nonce(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue_many([f"https://example.com/{i}" for i in range(4)])
    leases = [q.claim_next("w"), q.claim_next("w")]
    push = ListPush(KEYS, TEMPLATE)
    for window, lease in enumerate(leases, 1):
        assert q.complete_and_push(lease, window=window, push=push).pushed == 1
    tokens = [m["token"] for m in _messages(r, KEYS[3])]
    assert len(tokens) == len(set(tokens)) == 2  # the first message of each call


def test_another_database_gets_the_messages_and_the_caller_stays_on_its_own(q: TaskQueue, r: redis.Redis,
                                                                           redis_url: str) -> None:
    broker = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/7", decode_responses=True)
    broker.flushdb()
    try:
        first = q.enqueue("https://example.com/first")
        nxt = q.enqueue("https://example.com/next")
        done = q.complete_and_push(q.claim(first, "w"), window=1, push=ListPush(KEYS, TEMPLATE, db=7))
        assert (done.pushed, done.to_send) == (1, [])
        assert [m["id"] for m in _messages(broker, KEYS[3])] == [nxt]
        assert r.exists(KEYS[3]) == 0  # nothing in the state's database
        assert q.get(nxt).state == "dispatched"  # the same connection still reads the state database
        check_invariants(r, q)
    finally:
        broker.flushdb()
        broker.close()


def test_priorities_map_to_message_priorities_as_celery_priority_does(q: TaskQueue, r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first", priority=1000)
    priorities = [1000, 7, 3, 2, 0, -1, -6, -7, -1000]
    ids = {q.enqueue(f"https://example.com/p{p}", priority=p): p for p in priorities}
    done = q.complete_and_push(q.claim(first, "w"), window=len(ids), push=ListPush(KEYS, TEMPLATE))
    assert done.pushed == len(ids)
    for key_priority, key in enumerate(KEYS):
        for message in _messages(r, key):
            assert message["priority"] == key_priority == message_priority(ids[str(message["id"])])


def test_a_resent_task_is_left_to_the_caller(q: TaskQueue, r: redis.Redis) -> None:
    lost = q.enqueue("https://example.com/lost")
    first = q.enqueue("https://example.com/first")
    q.dispatch(window=1)  # `lost` is dispatched; its message never arrives
    done = q.complete_and_push(q.claim(first, "w"), window=2, redispatch_after=0.0,
                               push=ListPush(KEYS, TEMPLATE))
    assert [(d.task_id, d.resent) for d in done.to_send] == [(lost, True)]
    assert done.pushed == 0 and r.exists(*KEYS) == 0


def test_an_id_the_template_would_need_to_escape_is_left_to_the_caller(q: TaskQueue, r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first")
    plain = q.enqueue("https://example.com/plain")
    odd = 'odd"id'
    # A record under an id no enqueue makes (ids are alphanumeric), queued behind `plain`.
    put_raw_record(r, q.keys, odd, raw_record(r, q.keys, plain))
    r.rpush(f"{q.keys.prefix}r:0", odd)
    done = q.complete_and_push(q.claim(first, "w"), window=2, push=ListPush(KEYS, TEMPLATE))
    assert [d.task_id for d in done.to_send] == [odd]
    assert [m["id"] for m in _messages(r, KEYS[3])] == [plain]


def test_a_refused_push_completes_the_task_and_leaves_every_message_to_the_caller(q: TaskQueue,
                                                                               r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first")
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(2)])
    done = q.complete_and_push(q.claim(first, "w"), [("k", {"v": 1})], window=2,
                               push=ListPush(KEYS, TEMPLATE, db=100_000))  # no such database
    assert done.added == 1 and done.pushed == 0
    assert done.push_error and "DB" in done.push_error.upper()
    assert [d.task_id for d in done.to_send] == ids
    assert q.get(first).state == "completed" and q.stats()["dispatched"] == 2
    check_invariants(r, q)


def test_a_stale_lease_pushes_nothing(q: TaskQueue, r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first")
    q.enqueue("https://example.com/next")
    stale = q.claim(first, "w", ttl=0.01)
    wait_until(lambda: q.reclaim_expired() == 1, what="the short lease reclaimed")
    with pytest.raises(LeaseLost):
        q.complete_and_push(stale, window=2, push=ListPush(KEYS, TEMPLATE))
    assert r.exists(*KEYS) == 0


def test_without_a_refill_nothing_is_pushed(q: TaskQueue, r: redis.Redis) -> None:
    first = q.enqueue("https://example.com/first")
    q.enqueue("https://example.com/next")
    done = q.complete_and_push(q.claim(first, "w"), push=ListPush(KEYS, TEMPLATE))
    assert (done.to_send, done.pushed) == (None, 0) and r.exists(*KEYS) == 0


@pytest.mark.parametrize("bad", [
    {"keys": KEYS[:9]},
    {"keys": (*KEYS[:9], "")},
    {"template": ("a", "i")},
    {"template": ("a", "q", "b")},
    {"template": ("a" * 20_000,)},
    {"db": -1},
    {"db": "1"},
])
def test_a_bad_list_push_is_refused_before_any_call(bad: dict[str, object]) -> None:
    spec: dict[str, object] = {"keys": KEYS, "template": TEMPLATE, **bad}
    with pytest.raises(InvalidInput):
        ListPush(**spec)  # type: ignore[arg-type]


def test_push_must_be_a_list_push(q: TaskQueue) -> None:
    first = q.enqueue("https://example.com/first")
    lease = q.claim(first, "w")
    with pytest.raises(InvalidInput):
        q.complete_and_push(lease, window=1, push=("not", "one"))  # type: ignore[arg-type]
    assert q.get(first).state == "running"

