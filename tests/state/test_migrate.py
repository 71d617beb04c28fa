"""Moving a namespace into a new one of another shard count (``state/migrate.py``) against a real
Redis: every task in every state arrives once with its record, checkpoint and order, remembered URLs
stay duplicates, items and settings follow, a second run moves nothing twice, and the refusals."""

from __future__ import annotations

import pytest
import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.migrate import Migration
from celery_ha.state.migrate_read import paged
from celery_ha.state.pause import paused
from celery_ha.state.records import TaskInfo
from celery_ha.state.shards import namespace_keys, shard_of
from celery_ha.state.sink import iter_items
from celery_ha.state.worker_registry import heartbeat
from tests.support.invariants import check_invariants
from tests.support.records import all_records

HOSTS = ["a.example", "b.example", "c.example", "d.example", "e.example"]


def fill(q: TaskQueue) -> dict[str, list[str]]:
    """Tasks of ``q`` in every state: returns their ids by state."""
    urls = [f"http://{HOSTS[i % 5]}/p/{i}" for i in range(60)]
    done = q.enqueue_many(urls[:20])
    for _ in done:  # finished: 5 in the history (history_max), 16 remembered, 4 waiting (a.example)
        lease = q.claim_next("w")
        q.commit(lease, [(f"item-{lease.task_id}", {"url": lease.url})])
        q.complete(lease)
    low = q.enqueue_many(urls[20:50])
    high = q.enqueue_many(urls[50:55], priority=5)
    random = q.enqueue_many([{"url": f"http://{HOSTS[i % 5]}/r/{i}", "meta": {"i": i}} for i in range(5)],
                            dedup=False)
    by_state: dict[str, list[str]] = {"completed": done}
    leases = [q.claim_next("w") for _ in range(8)]  # the 5 high ones first, then 3 low
    q.save_checkpoint(leases[0], {"page": 7})
    assert q.release(leases[0].task_id, worker="w") == "queued"
    by_state["delayed"] = [leases[1].task_id]
    assert q.fail(leases[1], "try later") == "retry"
    by_state["dead"] = [leases[2].task_id]
    assert q.fail(leases[2], "gone", retry=False) == "dead"
    by_state["running"] = [lease.task_id for lease in leases[3:]]  # their worker is SIGKILLed, say
    by_state["dispatched"] = [d.task_id for d in q.dispatch(3)]
    moved = set(by_state["delayed"] + by_state["dead"] + by_state["running"] + by_state["dispatched"])
    by_state["queued"] = [t for t in high + low + random if t not in moved]
    by_state["checkpointed"] = [leases[0].task_id]
    return by_state


def test_an_ungated_namespace_moves_to_three_shards_whole_and_exactly_once(
        redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "old", lease_ttl=30, history_max=5, backoff_base=600)
    src.set_schedule(host="a.example", every=3600)
    ids = fill(src)
    before = src.stats()
    # 20 finished dedup URLs: the 4 of a.example wait for their scheduled run (their records are their
    # dedup memory, _refetch.lua), the 16 others are remembered
    assert (before["remembered"], before["refetch_waiting"]) == (16, 4) and before["completed_history"] <= 10

    report = Migration(src.client, "old", "new", 3).run()
    dst = TaskQueue.from_url(redis_url, "new", lease_ttl=30, shards=3)
    after = dst.stats()
    assert report.renamed == 0 and report.carried == 0 and report.remembered == 16 and report.unseen == 0
    assert after["queued"] == before["queued"] + before["dispatched"] + before["running"]
    assert (after["delayed"], after["dead"], after["running"], after["dispatched"]) == (1, 1, 0, 0)
    assert after["completed_history"] == before["completed_history"]
    assert (after["remembered"], after["refetch_waiting"]) == (16, 4)
    # stats goes on counting where the source stopped
    counted = ("completed", "items", "enqueued")
    assert [after[c] for c in counted] == [before[c] for c in counted]
    assert report.items == 20 and sorted(i["url"] for i in iter_items(dst.client, "new")) == sorted(
        i["url"] for i in iter_items(src.client, "old"))
    for tid in ids["queued"] + ids["dead"] + ids["delayed"] + ids["completed"][-2:]:
        old, new = src.get(tid), dst.get(tid)
        assert new is not None and (new.url, new.meta, new.attempts, new.token, new.dedup, new.state) == (
            old.url, old.meta, old.attempts, old.token, old.dedup, old.state)
    for tid in ids["running"]:  # a running task with no holder: a stall, as a reclaim counts it
        assert dst.get(tid).state == "queued" and dst.get(tid).stalls == 1
    assert dst.get(ids["dead"][0]).error == "gone"
    assert dst.schedules() == src.schedules()
    assert paused(r, "old") is not None and r.hget(dst.keys.meta, "migrated_from") == "old"
    check_invariants(r, dst)

    # Remembered URLs are duplicates in the target, whether or not the history kept their records.
    assert not any(new for _, new in dst.enqueue_many_with_status(
        [f"http://{HOSTS[i % 5]}/p/{i}" for i in range(20)]))
    # The checkpoint came along; the tasks of priority 5 left in the source go out first.
    leases = [dst.claim_next("w2") for _ in range(after["queued"])]
    assert all(lease is not None for lease in leases) and dst.claim_next("w2") is None
    for shard in range(3):  # priority order holds within each shard
        priorities = [lease.task.priority for lease in leases if shard_of(lease.task_id, 3) == shard]
        assert priorities == sorted(priorities, reverse=True)
    assert sum(lease.task.priority == 5 for lease in leases) == 3  # 1 released, 2 were running
    by_id = {lease.task_id: lease for lease in leases}
    assert by_id[ids["checkpointed"][0]].checkpoint == {"page": 7}
    assert set(by_id) == set(ids["queued"] + ids["running"] + ids["dispatched"])

    again = Migration(src.client, "old", "new", 3).run()  # moves nothing twice
    assert sum(again.tasks.values()) == 0 and again.items == 0 and again.remembered == 0
    assert again.present == sum(report.tasks.values()) and report.present == 0
    assert dst.stats()["running"] == after["queued"] and dst.stats()["queued"] == 0
    assert dst.stats()["completed"] == before["completed"]  # the counters are carried once


def test_a_gated_namespace_moves_to_four_shards_each_task_on_its_hosts_shard(
        redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "g", lease_ttl=30, history_max=5, backoff_base=600, host_gate=True,
                             shards=2)
    ids = fill(src)
    src.hosts.set("b.example", concurrency=1)
    src.hosts.block("c.example", 600, reason="banned")
    before = src.stats()

    report = Migration(src.client, "g", "g4", 4).run()
    dst = TaskQueue.from_url(redis_url, "g4", lease_ttl=30, shards=4, host_gate=True)
    after = dst.stats()
    assert after["queued"] == before["queued"] + before["dispatched"] + before["running"]
    assert report.renamed > 0 and report.carried == 20
    assert dst.hosts.get("b.example").concurrency == 1 and dst.hosts.get("c.example").state == "blocked"
    in_flight = 0
    for host in HOSTS:  # the budget used leaves out what was in flight: it is queued again
        old = r.hgetall(src.shard_keys()[shard_of(host, 2)].host_state(host))
        new = r.hgetall(dst.shard_keys()[shard_of(host, 4)].host_state(host))
        assert int(new["u"]) == int(old["u"]) - int(old.get("a", 0)) and not {"a", "d"} & set(new)
        in_flight += int(old.get("a", 0))
    assert in_flight == before["dispatched"] + before["running"]
    queued_ids = []
    for index, k in enumerate(dst.shard_keys()):
        for host in HOSTS:
            for band in r.zrange(k.host_bands(host), 0, -1):
                entries = r.lrange(k.host_list(band, host), 0, -1)
                assert all(shard_of(t, 4) == index == shard_of(host, 4) for t in entries)
                queued_ids += entries
    assert len(queued_ids) == after["queued"]
    check_invariants(r, dst)
    # Every finished URL is a duplicate, whether the history still held its record (remembered
    # under its new id) or not (carried: looked up under the source's id); so is every queued one.
    finished = [f"http://{HOSTS[i % 5]}/p/{i}" for i in range(20)]
    queued = [src.get(t).url for t in ids["queued"] if src.get(t).dedup]
    assert not any(new for _, new in dst.enqueue_many_with_status(finished + queued))
    assert dst.stats()["queued"] == after["queued"]
    # ... and it is crawled again once the recrawl window has passed since it finished.
    again = dst.enqueue_many_with_status(finished[:3], recrawl_after=0)
    assert [new for _, new in again] == [True] * 3
    # Every task goes out through the gate, c.example's not while it is blocked.
    got = []
    while (lease := dst.claim_next("w2")) is not None:
        got.append(lease)
        dst.complete(lease)
    assert {lease.task.host for lease in got} == set(HOSTS) - {"c.example"}
    assert len(got) + dst.stats()["queued"] == after["queued"] + 3  # with the 3 crawled again


def test_refusals_write_nothing(redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "src", lease_ttl=30)
    src.enqueue_many(["http://a.example/1"])
    with pytest.raises(ConfigurationError, match="must differ"):
        Migration(src.client, "src", "src", 2)
    heartbeat(r, "src", "host-1:123")
    with pytest.raises(ConfigurationError, match="stop the workers of 'src'"):
        Migration(src.client, "src", "dst", 2).check(lease_ttl=30)
    r.delete(src.keys.workers)
    TaskQueue.from_url(redis_url, "busy").enqueue_many(["http://b.example/1"])
    with pytest.raises(ConfigurationError, match="'busy' is not empty"):
        Migration(src.client, "src", "busy", 2).check(lease_ttl=30)
    with pytest.raises(ConfigurationError, match="holds no tasks"):
        Migration(src.client, "nothing", "dst", 2).check(lease_ttl=30)
    Migration(src.client, "src", "dst", 2).check(lease_ttl=30)
    assert not r.exists("cha:{dst}:meta") and paused(r, "src") is None
    Migration(src.client, "src", "dst", 2).run()
    with pytest.raises(ConfigurationError, match="'dst' was migrated from 'src' already"):
        Migration(src.client, "src", "dst", 2).check(lease_ttl=30)


def test_carried_urls_stay_duplicates_through_a_second_migration(redis_url: str, r: redis.Redis) -> None:
    """g1 (gated, 1 shard) -> g3 -> g5: the ids of g1 and of g3 differ from g5's, and both are carried."""
    first = TaskQueue.from_url(redis_url, "g1", lease_ttl=30, history_max=0, host_gate=True)
    old = [f"http://{HOSTS[i % 5]}/old/{i}" for i in range(40)]
    for _ in first.enqueue_many(old):
        first.complete(first.claim_next("w"))
    Migration(first.client, "g1", "g3", 3).run()
    middle = TaskQueue.from_url(redis_url, "g3", lease_ttl=30, history_max=0, host_gate=True, shards=3)
    assert not any(new for _, new in middle.enqueue_many_with_status(old))
    newer = [f"http://{HOSTS[i % 5]}/new/{i}" for i in range(40)]
    for _ in middle.enqueue_many(newer):
        middle.complete(middle.claim_next("w"))
    report = Migration(first.client, "g3", "g5", 5).run()
    assert report.carried == 80  # g3's own 40, and the 40 it carried from g1
    last = TaskQueue.from_url(redis_url, "g5", lease_ttl=30, host_gate=True, shards=5)
    fresh = [f"http://{HOSTS[i % 5]}/fresh/{i}" for i in range(10)]
    status = last.enqueue_many_with_status(old + newer + fresh)
    assert [new for _, new in status] == [False] * 80 + [True] * 10


def _url_clashing() -> tuple[str, str]:
    """A URL whose plain dedup id is off its host's shard of 2 and on its host's shard of 3."""
    from celery_ha.state.ids import task_id_for

    for i in range(10_000):
        url = f"http://h{i % 7}.example/c/{i}"
        plain = task_id_for("fetch_page", url)
        host = f"h{i % 7}.example"
        if shard_of(plain, 2) != shard_of(host, 2) and shard_of(plain, 3) == shard_of(host, 3):
            return url, plain
    raise AssertionError("no such URL")


def test_a_task_queued_twice_across_a_gate_switch_stays_two_tasks(redis_url: str, r: redis.Redis) -> None:
    """Queued with the gate off (its plain id), then on (placed on its host's shard: another id): in
    the target the placed one's first candidate is the plain id, which the other task holds."""
    url, plain = _url_clashing()
    before = TaskQueue.from_url(redis_url, "sw", shards=2, default_task="fetch_page")
    assert before.enqueue_many([url]) == [plain]
    after = TaskQueue.from_url(redis_url, "sw", shards=2, host_gate=True, default_task="fetch_page")
    placed = after.enqueue_many([url])[0]
    assert placed != plain and after.stats()["queued"] == 2
    report = Migration(after.client, "sw", "sw3", 3).run()
    dst = TaskQueue.from_url(redis_url, "sw3", shards=3, host_gate=True, default_task="fetch_page")
    assert report.tasks == {"queued": 2} and report.present == 0 and dst.stats()["queued"] == 2
    assert len([lease for lease in iter(lambda: dst.claim_next("w"), None)]) == 2
    check_invariants(r, dst)


def test_tasks_left_in_host_queues_after_the_gate_went_off_follow_their_host(
        redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "off", shards=2, host_gate=True)
    src.enqueue_many([f"http://{HOSTS[i % 5]}/o/{i}" for i in range(40)])
    src.hosts.block("c.example", 600, reason="banned")
    src.hosts.switch(False)
    src.enqueue_many(["http://a.example/plain"])  # queued in its band, no host
    report = Migration(src.client, "off", "off3", 3).run()
    dst = TaskQueue.from_url(redis_url, "off3", shards=3)
    assert sum(report.tasks.values()) == 41
    for index, k in enumerate(dst.shard_keys()):
        for host in HOSTS:
            for band in r.zrange(k.host_bands(host), 0, -1):
                assert all(shard_of(t, 3) == index == shard_of(host, 3)
                           for t in r.lrange(k.host_list(band, host), 0, -1))
    got = [lease.task.host for lease in iter(lambda: dst.claim_next("w"), None)]
    assert len(got) == 41 - 8 and "c.example" not in got  # c.example's 8 wait for its block
    check_invariants(r, dst)


def test_ids_remembered_by_the_first_release_move_too(redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "old01")
    tid = src.task_ids(["http://a.example/seen"])[0]
    r.sadd(src.keys.legacy_seen, tid)  # the 0.1 releases' set of finished dedup ids
    assert src.enqueue_many_with_status(["http://a.example/seen"])[0][1] is False
    report = Migration(src.client, "old01", "new01", 2).run()
    dst = TaskQueue.from_url(redis_url, "new01", shards=2)
    assert report.remembered == 1
    assert dst.enqueue_many_with_status(["http://a.example/seen"])[0][1] is False


def test_carried_urls_are_looked_up_under_the_namespaces_key_mode(redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "rd", shards=2, host_gate=True, history_max=0)
    src.hosts.set_mode("registered-domain")
    urls = [f"http://s{i}.site{i % 4}.test/p" for i in range(30)]
    for _ in src.enqueue_many(urls):
        src.complete(src.claim_next("w"))
    assert Migration(src.client, "rd", "rd3", 3).run().carried == 30
    fresh = TaskQueue.from_url(redis_url, "rd3", shards=3, host_gate=True)  # has not read the mode yet
    assert not any(new for _, new in fresh.enqueue_many_with_status(urls))


def test_a_record_neither_queue_pass_sees_is_taken_by_a_third(redis_url: str, r: redis.Redis) -> None:
    """A queued record in no queue (what a record that became queued between the passes looks like):
    the shard holds more records than the two passes saw, so every queued record is looked at."""
    src = TaskQueue.from_url(redis_url, "lost")
    ids = src.enqueue_many([f"http://a.example/{i}" for i in range(5)])
    r.lrem(src.keys.ready_list(0), 0, ids[2])
    report = Migration(src.client, "lost", "found", 2).run()
    assert report.unseen == 0 and report.tasks == {"queued": 5} and report.present == 0
    assert r.hget("cha:{found}:meta", "migrated_from") == "lost"
    assert not any(r.exists(k.prefix + "migmap") for k in TaskQueue(r, "found", shards=2).shard_keys())


def test_a_namespace_migrated_away_refuses_new_tasks_naming_the_new_one(redis_url: str) -> None:
    """A producer still pointed at the old namespace must be told, not fill a crawl paused for good."""
    src = TaskQueue.from_url(redis_url, "old")
    src.enqueue("http://a.example/1")
    late = TaskQueue.from_url(redis_url, "old")  # a producer that read nothing yet
    Migration(src.client, "old", "new", 2).run()
    for q, dedup in ((late, True), (TaskQueue.from_url(redis_url, "old"), False)):
        with pytest.raises(ConfigurationError, match="migrated to 'new'"):
            q.enqueue("http://a.example/2", dedup=dedup)
    assert TaskQueue.from_url(redis_url, "new", shards=2).stats()["queued"] == 1


class _WorkedOn(Migration):
    """A migration while something still changes the source: a pump that has not read the pause flag
    yet dispatches a task between each two pages the migration reads (deterministic, as a test needs;
    a claim there is refused from the migration's start)."""

    def __init__(self, worker: TaskQueue, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.worker = worker
        self.window = 0

    def _import_page(self, page: list, k: QueueKeys) -> None:  # type: ignore[type-arg]
        self.window += 1  # one more dispatched at each page
        self.worker.dispatch(self.window)  # a pump of the source whose pause flag is not read yet
        super()._import_page(page, k)


def _urls(r: redis.Redis, namespace: str) -> set[str]:
    return {TaskInfo.parse(tid, raw).url
            for k in namespace_keys(r, namespace) for tid, raw in all_records(r, k)}


def test_a_source_worked_on_while_read_stays_open_and_a_run_after_takes_every_task(
        redis_url: str, r: redis.Redis) -> None:
    """A dispatch pops the head of the band the first pass pages through, and the task it took is then
    read twice (queued, then dispatched): the counts add up while tasks are missing. The migration
    must not finish (nor mark the source), and the run after the worker stopped must take all."""
    src = TaskQueue.from_url(redis_url, "busy")
    src.enqueue_many([f"http://{HOSTS[i % 5]}/b/{i}" for i in range(3000)])
    report = _WorkedOn(TaskQueue.from_url(redis_url, "busy"), r, "busy", "busy2", 2).run()
    assert report.unseen > 0
    assert r.hget("cha:{busy2}:meta", "migrated_from") is None
    assert r.hget(src.keys.meta, "migrated_to") is None
    with pytest.raises(ConfigurationError, match="'busy' is being migrated to 'busy2'"):
        Migration(r, "busy", "elsewhere", 2).check(lease_ttl=30)  # half-way to one target: not another

    Migration(r, "busy", "busy2", 2).check(lease_ttl=30)  # the worker stopped: the same one goes on
    again = Migration(r, "busy", "busy2", 2).run()
    assert again.unseen == 0 and r.hget("cha:{busy2}:meta", "migrated_from") == "busy"
    assert _urls(r, "busy") <= _urls(r, "busy2")  # none lost
    with pytest.raises(ConfigurationError, match="'busy' was migrated to 'busy2' already"):
        Migration(r, "busy", "elsewhere", 2).check(lease_ttl=30)  # the crawl runs in one namespace only
    assert not r.exists("cha:{elsewhere}:meta")


def test_a_page_of_a_queue_skips_nothing_when_its_head_is_popped_between_reads(r: redis.Redis) -> None:
    r.rpush("q", *[f"t{i}" for i in range(1000)])
    seen: list[str] = []
    popped: list[str] = []
    for n, page in enumerate(paged(lambda a, b: r.lrange("q", a, b), page=100)):
        seen += page
        popped += r.lpop("q", 7) or []  # claims at the head between two reads
        if n == 2:
            r.lpush("q", "back")  # a release to the front moves the rest the other way
    assert set(seen) | set(popped) >= {f"t{i}" for i in range(1000)}


def test_leases_still_held_refuse_a_migration(redis_url: str, r: redis.Redis) -> None:
    """A standalone worker does not heartbeat: its lease is what shows it works on the namespace."""
    src = TaskQueue.from_url(redis_url, "solo", lease_ttl=30, shards=2)
    src.enqueue_many(["http://a.example/1", "http://b.example/2"])
    lease = src.claim_next("standalone")
    with pytest.raises(ConfigurationError, match=r"'solo' first: 1 task\(s\) hold a lease"):
        Migration(r, "solo", "solo4", 4).check(lease_ttl=30)
    src.complete(lease)
    Migration(r, "solo", "solo4", 4).check(lease_ttl=30)


def test_a_run_that_stopped_between_its_last_marks_is_finished_by_the_next(
        redis_url: str, r: redis.Redis) -> None:
    """The target marked ``migrated_from`` but the source not ``migrated_to`` (what an earlier release
    left when it stopped there): the next run writes the rest instead of refusing."""
    src = TaskQueue.from_url(redis_url, "half")
    src.enqueue_many(["http://a.example/1"])
    Migration(r, "half", "half2", 2).run()
    r.hdel(src.keys.meta, "migrated_to")
    r.hset("cha:{half2}:meta", "migrating_from", "half")
    migration = Migration(r, "half", "half2", 2)
    migration.check(lease_ttl=30)
    assert sum(migration.run().tasks.values()) == 0
    assert r.hget(src.keys.meta, "migrated_to") == "half2"
    assert r.hmget("cha:{half2}:meta", ["migrated_from", "migrating_from"]) == ["half", None]
    with pytest.raises(ConfigurationError, match="migrated to 'half2'"):
        TaskQueue.from_url(redis_url, "half").enqueue("http://a.example/2")
