"""Refetch schedules on a real Redis: set once for every process, a completion schedules the next run
and keeps the record past the history's trim, the sweep's refetch_due queues due runs (through the host
gate when on), the most specific schedule wins, adaptive intervals follow the output's signature."""

from __future__ import annotations

import time

import pytest
import redis

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.state import TaskQueue
from celery_ha.state.host_queues import host_queue_ids
from celery_ha.state.records import HEAD_SEP, Lease
from tests.support.celery_helpers import wait_for
from tests.support.invariants import check_invariants
from tests.support.records import put_raw_record, raw_record
from tests.support.refetch import scheduled_at


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sc", history_max=2)


def _run(q: TaskQueue, tid: str, verdict: str = "") -> Lease:
    lease = q.claim(tid, "w:1")
    assert lease is not None, q.get(tid)
    lease.verdict = verdict
    q.complete(lease)
    return lease


def _redis_ms(q: TaskQueue) -> int:
    seconds, micros = q.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _run_in_order(q: TaskQueue, ids: list[str]) -> None:
    """Run `ids` one after another, each completing in a later Redis millisecond than the one before:
    the history orders completions of one millisecond by id, so its trim would pick among them by id."""
    for tid in ids:
        _run(q, tid)
        done = _redis_ms(q)
        wait_for(lambda done=done: _redis_ms(q) > done, timeout=5, message="the clock's next millisecond")


def _due_in(q: TaskQueue, tid: str) -> float:
    """Seconds from now (Redis clock) until the task's scheduled run."""
    score = scheduled_at(q, tid)
    assert score is not None, f"{tid} has no scheduled run"
    seconds, micros = q.client.time()
    return score / 1000 - (int(seconds) + int(micros) / 1e6)


def test_set_list_and_unset(q: TaskQueue) -> None:
    q.set_schedule("crawl_list", every="1d")
    q.set_schedule("fetch_page", every="1w", adaptive=True)
    q.set_schedule(host="News.Example", every="1h")
    q.set_schedule("fetch_page", "news.example", every=0)
    got = {(s.task, s.host): s for s in q.schedules()}
    assert got[("crawl_list", None)].every == 86400 and not got[("crawl_list", None)].adaptive
    page = got[("fetch_page", None)]
    assert (page.every, page.min_every, page.max_every, page.adaptive) == (604800, 151200, 4838400, True)
    assert got[(None, "news.example")].every == 3600  # host keys are normalised
    assert got[("fetch_page", "news.example")].every == 0
    assert q.unset_schedule(host="news.example") and not q.unset_schedule(host="news.example")
    assert q.client.hexists(q.keys.schedules, "_h")  # fetch_page@news.example is a host entry too
    assert q.unset_schedule("fetch_page", "news.example")
    assert not q.client.hexists(q.keys.schedules, "_h")


@pytest.mark.parametrize("kwargs, message", [
    ({"every": "1d"}, "a task name, a host, or both"),
    ({"task": "t", "every": "soon"}, "bad every"),
    ({"task": "t", "every": 0.5}, "at least 1 seconds"),
    ({"task": "t", "every": "1h", "min_every": "2h", "adaptive": True}, "min_every <= every"),
    ({"task": "t", "every": "1h", "max_every": "2h"}, "add adaptive=True"),
    ({"task": "bad name!", "every": "1h"}, "task name"),
])
def test_bad_schedules_are_refused_in_one_line(q: TaskQueue, kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        q.set_schedule(**kwargs)
    assert q.schedules() == []


def test_a_scheduled_task_runs_again_however_old_its_completion(q: TaskQueue) -> None:
    q.set_schedule("crawl_list", every=4)  # long enough for a slow machine to check "not yet due"
    tid = q.enqueue("https://shop.example/list", task="crawl_list")
    others = q.enqueue_many([f"https://shop.example/p/{i}" for i in range(5)])  # no schedule
    _run_in_order(q, [tid, *others])
    # The history (history_max=2) trimmed the scheduled task's completion; its record stays.
    assert not q.client.zscore(q.keys.completed, tid)
    assert q.get(tid).state == "completed" and q.get(tid).refetch_every == 4
    assert q.get_many([others[0]]) == [None]  # an unscheduled record left with the history
    assert 0 < _due_in(q, tid) <= 4.0
    assert q.refetch_due() == 0 and q.get(tid).state == "completed"
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the scheduled run")
    info = q.get(tid)
    assert info.state == "queued" and info.attempts == 0 and q.stats()["refetched"] == 1
    assert scheduled_at(q, tid) is None
    assert q.enqueue("https://shop.example/list", task="crawl_list") == tid  # a live duplicate
    assert q.stats()["duplicates"] == 1
    _run(q, tid)  # the next completion schedules the next run
    assert 0 < _due_in(q, tid) <= 4.0
    check_invariants(q.client, q)


def test_the_most_specific_schedule_applies(q: TaskQueue) -> None:
    q.set_schedule("page", every="1d")
    q.set_schedule(host="a.example", every="1h")
    q.set_schedule("page", "a.example:8080", every="2h")
    q.set_schedule("page", "b.example", every=0)  # never, an exception to the task's
    cases = {"https://c.example/1": 86400, "http://A.example:80/1": 3600,
             "https://a.example:8080/1": 7200, "https://u:p@a.example/1": 3600}
    for url, interval in cases.items():
        tid = q.enqueue(url, task="page")
        _run(q, tid)
        assert q.get(tid).refetch_every == interval, url
        assert interval - 2 < _due_in(q, tid) <= interval, url
    never = q.enqueue("https://b.example/1", task="page")
    _run(q, never)
    assert scheduled_at(q, never) is None and q.get(never).refetch_every is None
    other = q.enqueue("https://a.example/2", task="other")  # the host entry covers every task
    _run(q, other)
    assert q.get(other).refetch_every == 3600


def test_host_schedules_find_the_host_of_every_payload_form(q: TaskQueue) -> None:
    """url_host of _refetch.lua reads the host of a bare https URL stored without its scheme
    ("//host/p"), of a whole https:// URL a record of an earlier release holds, of an http URL and
    of a JSON payload; the old form is written in the new one at the completion."""
    q.set_schedule(host="a.example", every="1h")
    sep = HEAD_SEP
    put_raw_record(q.client, q.keys, "OLDRECORD0S1", f"q{sep}1796407325451{sep}1{sep}page\nhttps://a.example/old")
    q.client.rpush(q.keys.ready_list(0), "OLDRECORD0S1")
    q.client.zadd(q.keys.ready_bands, {"0": 0})
    cases = {"OLDRECORD0S1": "//a.example/old"}
    for url, body in {"https://a.example/1": "//a.example/1", "https://A.example:443/2": "//A.example:443/2",
                      "https://u:p@a.example/3": "//u:p@a.example/3", "http://a.example:80/4": "http://a.example:80/4",
                      "https://a.example/5?q=\"j\"": '{"u":"https://a.example/5?q=\\"j\\""}',
                      "https://a.example./6": "//a.example./6",
                      "https://A.example.:443/7": "//A.example.:443/7"}.items():
        tid = q.enqueue(url, task="page")
        assert raw_record(q.client, q.keys, tid).partition("\n")[2] == body, url
        cases[tid] = body
    for tid, body in cases.items():
        _run(q, tid)
        assert q.get(tid).refetch_every == 3600, (tid, body)
        assert raw_record(q.client, q.keys, tid).partition("\n")[2] == body, tid
    assert q.get("OLDRECORD0S1").url == "https://a.example/old" and q.get("OLDRECORD0S1").dedup
    other = q.enqueue("https://b.example/a.example", task="page")  # another host: no schedule
    _run(q, other)
    assert q.get(other).refetch_every is None and scheduled_at(q, other) is None
    # The scheduled run of the old record is queued again in the new form, a dedup task's letter: made
    # due now through the index of earlier releases (whose waiting records were never counted).
    q.client.zadd(q.keys.refetch, {"OLDRECORD0S1": 0})
    q.client.hincrby(q.keys.stats, "refetch_waiting", -1)
    assert q.refetch_due() == 1
    head, _, body = raw_record(q.client, q.keys, "OLDRECORD0S1").partition("\n")
    assert head[:1] == "Q" and body == "//a.example/old"
    assert (q.get("OLDRECORD0S1").state, q.get("OLDRECORD0S1").url) == ("queued", "https://a.example/old")
    check_invariants(q.client, q)


def test_gated_tasks_are_refetched_through_their_host_queue(redis_url: str) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sg", host_gate=True)
    q.set_schedule(host="slow.example", every=1)
    tid = q.enqueue("https://slow.example/a", task="page")
    lease = q.claim_next("w:1")
    assert lease is not None and lease.task_id == tid and lease.task.host == "slow.example"
    q.complete(lease)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the scheduled run")
    assert tid in host_queue_ids(q.client, q.keys, "slow.example")
    assert q.hosts.get("slow.example").queued == 1
    check_invariants(q.client, q)


def test_adaptive_intervals_follow_the_signature(q: TaskQueue) -> None:
    q.set_schedule("page", every=100, min_every=60, max_every=200, adaptive=True)
    tid = q.enqueue("https://shop.example/p", task="page")
    seen = []
    for verdict in ("aaaa", "aaaa", "aaaa", "=", "bbbb", "", "cccc", "cccc", "cccc"):
        _run(q, tid, verdict)
        seen.append(q.get(tid).refetch_every)
        assert q.recrawl([tid]) == {tid: "queued"}  # the next run now (the schedule's state stays)
    # first signature: no verdict; same: x1.4 (clamped at 200); a 304: x1.4; changed: x0.8; none:
    # unchanged; changed; same, same.
    assert seen == [100, 140, 196, 200, 160, 160, 128, 179.2, 200]
    assert q.get(tid).signature == "cccc"


def test_enqueue_past_the_recrawl_window_keeps_the_schedule_state(q: TaskQueue) -> None:
    q.set_schedule("page", every=100, adaptive=True)
    tid = q.enqueue("https://shop.example/p", task="page")
    _run(q, tid, "aaaa")
    _run_again = q.enqueue_many_with_status(["https://shop.example/p"], task="page", recrawl_after=0)
    assert _run_again == [(tid, True)]
    assert scheduled_at(q, tid) is None  # a new run: no longer waiting
    _run(q, tid, "aaaa")
    assert q.get(tid).refetch_every == 140


def test_sharded_namespaces_schedule_on_every_shard(redis_url: str) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "ss", shards=3)
    q.set_schedule("page", every=1)
    ids = q.enqueue_many([f"https://s{i}.example/" for i in range(12)], task="page")
    assert len({q._of(t) for t in ids}) > 1
    for _ in ids:
        lease = q.claim_next("w:1")
        assert lease is not None
        q.complete(lease)
    deadline = time.monotonic() + 15
    queued = 0
    while queued < len(ids) and time.monotonic() < deadline:
        queued += q.refetch_due()
    assert queued == len(ids) and q.stats()["queued"] == len(ids)
    assert q.refetch_pending() == {"waiting": 0, "due": 0}


def test_listing_and_recrawl_see_scheduled_tasks_past_the_history(q: TaskQueue) -> None:
    from celery_ha.state.listing import completed_matching

    q.set_schedule("list", every="1d")
    listed = [q.enqueue(f"https://shop.example/list/{i}", task="list") for i in range(4)]
    for tid in listed:
        _run(q, tid)
    assert q.client.zcard(q.keys.completed) == 2 + 0  # history_max=2 (the trim is periodic)
    assert sorted(completed_matching(q, match="https://shop.example/list/*")) == sorted(listed)
    assert q.recrawl(listed) == dict.fromkeys(listed, "queued")
    assert q.refetch_pending() == {"waiting": 0, "due": 0}


def test_metrics_count_waiting_and_due_runs(redis_url: str) -> None:
    from celery_ha.monitoring.collector import queue_families
    from celery_ha.state.metrics import read_queue_metrics

    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sm", shards=2)
    q.set_schedule("soon", every=1)
    q.set_schedule("later", every="1d")
    for task in ("soon", "later", "later"):
        tid = q.enqueue(f"https://{task}.example/{time.time_ns()}", task=task)
        _run(q, tid)
    wait_for(lambda: q.refetch_pending()["due"] == 1, timeout=10, message="one run due")
    m = read_queue_metrics(q.client, q.namespace)
    assert m.refetch == {"waiting": 3, "due": 1}
    family = next(f for f in queue_families(m, 30) if f.name == "celery_ha_refetch")
    assert {s.labels["kind"]: s.value for s in family.samples} == {"waiting": 3, "due": 1}
    assert q.refetch_due() == 1
    assert read_queue_metrics(q.client, q.namespace).refetch == {"waiting": 2, "due": 0}


def test_a_scheduled_task_the_dedup_sweep_forgot_is_still_a_finished_one(redis_url: str) -> None:
    """The sweep forgets a finished id past the dedup TTL even while its record waits for a scheduled
    refetch; the record's own completion time then decides: a recrawl window, the TTL and a newer
    sitemap lastmod start a new run, as for an unscheduled URL (they used to see a live duplicate)."""
    from celery_ha.state.done_times import finished_at, remembered

    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sf", history_max=0, dedup_ttl=1)
    q.set_schedule("page", every="1w")
    url = "https://shop.example/p/1"
    tid = q.enqueue(url, task="page")
    _run(q, tid)  # leaves the history at once (history_max=0); its record waits for the refetch
    assert q.client.zscore(q.keys.completed, tid) is None and scheduled_at(q, tid)
    wait_for(lambda: q.forget_finished() >= 0 and not remembered(q.client, q.keys, tid), timeout=10,
             message="the sweep to forget the id (TTL 1 s)")
    [done] = finished_at(q.client, q.namespace, 1, [tid])
    assert done == int(q.get(tid).updated_at * 1000)  # the record's exact completion time
    assert q.enqueue_many_with_status([url], task="page", recrawl_after=3600) == [(tid, False)]
    wait_for(lambda: q.enqueue_many_with_status([url], task="page") == [(tid, True)], timeout=10,
             message="a new run once the TTL (1 s) has passed since the completion")
    assert q.get(tid).state == "queued" and scheduled_at(q, tid) is None


def test_schedules_check_the_namespaces_shard_count(redis_url: str) -> None:
    """A process configured with another shard count is refused, as by every other verb, instead of
    writing the schedule to its own shards only (the others' tasks were never refetched)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    TaskQueue(client, "sl", shards=4).enqueue_many([f"https://s{i}.example/p" for i in range(8)], task="page")
    wrong = TaskQueue(client, "sl", shards=1)  # as the CLI and workers build it: CELERY_HA_SHARDS=1
    for call in (lambda: wrong.set_schedule("page", every=60), lambda: wrong.unset_schedule("page"),
                 wrong.schedules, wrong.refetch_pending, lambda: list(wrong.refetch_ids())):
        with pytest.raises(ConfigurationError, match="holds tasks in 4 shard"):
            call()
    assert not client.keys("*{sl}*sched*") and not client.keys("*sl*sched*")


def test_unsetting_the_last_host_schedule_drops_the_host_flag_only_then(q: TaskQueue) -> None:
    q.set_schedule(host="news.example", every=60)
    q.set_schedule("page", host="shop.example", every=60)
    q.set_schedule("page", every=60)
    assert q.unset_schedule(host="news.example") and q.client.hget(q.keys.schedules, "_h") == "1"
    assert q.unset_schedule("page") and q.client.hget(q.keys.schedules, "_h") == "1"
    assert q.unset_schedule("page", host="shop.example") and q.client.hget(q.keys.schedules, "_h") is None
    assert not q.unset_schedule("page", host="shop.example")
