"""The Lua script caller: NOSCRIPT recovery, reconnects, and never running a transition twice."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading

import pytest
import redis

from celery_ha.redisio.scripts import LuaScript
from celery_ha.state import TaskQueue
from celery_ha.state.taskqueue import task_id_for

# Counts its runs, then keeps Redis busy for ~300 ms (longer than the client's socket timeout below).
SLOW_INCR = """
redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > 300000
return 1
"""


def test_noscript_after_script_flush_is_recovered(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/a")
    r.script_flush()
    q.enqueue("https://example.com/b")
    lease = q.claim_next("w")
    assert lease is not None and lease.url == "https://example.com/a"
    r.script_flush()
    q.complete(lease)
    assert q.stats()["completed"] == 1 and q.stats()["queued"] == 1


def test_a_killed_connection_is_replaced(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/a")
    r.client_kill_filter(_type="normal", skipme=True)  # every connection but this test's own
    q.enqueue("https://example.com/b")
    assert q.stats()["queued"] == 2


@pytest.mark.parametrize("single_connection", [False, True])
def test_a_lost_reply_is_never_answered_by_running_the_script_again(
        redis_url: str, r: redis.Redis, single_connection: bool) -> None:
    """redis-py retries a command whose reply timed out; a claim or completion must not run twice."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.05,
                                  single_connection_client=single_connection)
    script = LuaScript(client, SLOW_INCR)
    r.script_load(SLOW_INCR)
    with pytest.raises(redis.TimeoutError):
        script(keys=["runs"])
    # Any re-sent request was written before this PING, so Redis has run it by the time it answers.
    assert r.ping()
    assert r.get("runs") == "1"


def test_each_thread_gives_its_connection_back_when_it_ends(redis_url: str) -> None:
    """Threads pin a pooled connection; 10 short-lived threads must fit in a pool of 2."""
    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(
        redis_url, decode_responses=True, max_connections=2))
    q = TaskQueue(client)
    for i in range(10):
        worker = threading.Thread(target=q.enqueue, args=(f"https://example.com/{i}",))
        worker.start()
        worker.join()
        gc.collect()
    assert q.stats()["queued"] == 10  # stats() itself needs a free pool connection


def test_a_forked_child_never_shares_its_parents_socket(redis_url: str) -> None:
    """Parent and child call scripts at the same time after a fork: a shared socket would mix replies."""
    q = TaskQueue.from_url(redis_url)
    q.enqueue("https://example.com/warm")  # the parent pins a connection before forking
    urls = {side: [f"https://example.com/{side}/{i}" for i in range(300)] for side in ("parent", "child")}
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_enqueue_and_check, args=(q, urls["child"]))
    child.start()
    _enqueue_and_check(q, urls["parent"])
    child.join(timeout=60)
    assert child.exitcode == 0
    assert q.stats()["queued"] == 601


def _enqueue_and_check(q: TaskQueue, urls: list[str]) -> None:
    for url in urls:
        assert q.enqueue(url) == task_id_for("fetch_page", url)
        # Each process writes only on sockets it opened itself (a connection records its opener's pid).
        assert q._scripts.enqueue._pins.acquire().pid == os.getpid()
