"""Fuzz the TaskQueue's public API: hostile input is either accepted or refused with a typed error,
and a refusal writes nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import MAX_JSON_DEPTH
from celery_ha.state import Lease, TaskQueue
from tests.fuzz.hostile import (
    FUZZ,
    GOOD_URLS,
    attempt,
    hostile_dict,
    hostile_json,
    hostile_text,
    hostile_url,
    nested,
    numbers,
    wrong,
)


class World:
    """A queue with a known state, rebuilt for every example: two queued tasks, one running under
    ``lease``, one dead (``dead_id``)."""

    def __init__(self, url: str) -> None:
        self.raw = redis.Redis.from_url(url)
        self.q = TaskQueue(redis.Redis.from_url(url, decode_responses=True), "fz", lease_ttl=30)

    def reset(self) -> None:
        self.raw.flushdb()
        q = self.q
        self.ids = q.enqueue_many(["http://example.com/1", "http://example.com/2", "http://example.com/3"])
        self.dead_id = q.enqueue("http://example.com/dead", max_attempts=1)
        dead = q.claim(self.dead_id, "w0")
        assert dead is not None
        q.fail(dead, "boom", retry=False)
        lease = q.claim(self.ids[0], "w1")
        assert lease is not None
        self.lease = lease

    def lease_like(self, kind: str) -> Any:
        """The real lease, a stale or tampered copy of it, or something that is no lease at all."""
        real = self.lease
        return {
            "real": real,
            "stale": dataclasses.replace(real, token=real.token + 1),
            "none": None, "str": "lease", "dict": {"task_id": real.task_id, "token": real.token},
            "neg_token": dataclasses.replace(real, token=-1),
            "big_token": dataclasses.replace(real, token=2**70),
            "str_token": dataclasses.replace(real, token="1"),
            "bool_token": dataclasses.replace(real, token=True),
            "surrogate_id": dataclasses.replace(real, task_id="\ud800"),
            "bytes_id": dataclasses.replace(real, task_id=b"x"),
            "unknown_id": dataclasses.replace(real, task_id="nope"),
        }[kind]


LEASES = st.sampled_from(["real", "stale", "none", "str", "dict", "neg_token", "big_token", "str_token",
                          "bool_token", "surrogate_id", "bytes_id", "unknown_id"])
task_ids = st.one_of(st.sampled_from(["<queued>", "<running>", "<dead>", "nope"]), hostile_text, wrong)
ttls = st.one_of(st.none(), st.sampled_from([0.5, 30]), numbers)
names = st.one_of(st.sampled_from(["fetch_page", "crawl:list", None]), hostile_text, wrong)
small_ints = st.one_of(st.none(), st.integers(-2000, 2000), numbers)


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    w = World(redis_url)
    yield w
    w.raw.close()


def _tid(world: World, tid: Any) -> Any:
    return {"<queued>": world.ids[1], "<running>": world.ids[0], "<dead>": world.dead_id}.get(tid, tid) \
        if isinstance(tid, str) else tid


@FUZZ
@given(url=hostile_url, task=names, priority=small_ints, meta=st.one_of(st.none(), hostile_json),
       dedup=st.one_of(st.booleans(), wrong), max_attempts=small_ints, max_stalls=small_ints)
def test_enqueue(world: World, url: Any, task: Any, priority: Any, meta: Any, dedup: Any,
                 max_attempts: Any, max_stalls: Any) -> None:
    world.reset()
    attempt(world.raw, lambda: world.q.enqueue(url, task=task, priority=priority, meta=meta, dedup=dedup,
                                               max_attempts=max_attempts, max_stalls=max_stalls))


spec = st.one_of(hostile_url, st.fixed_dictionaries(
    {"url": hostile_url}, optional={"meta": hostile_json, "priority": small_ints, "task": names,
                                    "bogus": st.integers(), 1: st.none()}))


@FUZZ
@given(specs=st.one_of(st.lists(spec, max_size=4), wrong, hostile_text, st.sampled_from(GOOD_URLS),
                       st.builds(iter, st.lists(st.sampled_from(GOOD_URLS), max_size=3))),
       good_first=st.booleans(), batch_size=st.one_of(st.sampled_from([1, 2, 1000]), numbers),
       priority=small_ints, task=names)
def test_enqueue_many(world: World, specs: Any, good_first: bool, batch_size: Any, priority: Any,
                      task: Any) -> None:
    """A bad spec anywhere in the call (or a bad batch size) writes none of the good ones."""
    world.reset()
    if good_first and isinstance(specs, list):
        specs = ["http://example.com/good-a", *specs, "http://example.com/good-b"]
    attempt(world.raw, lambda: world.q.enqueue_many(specs, batch_size=batch_size, priority=priority or 0,
                                                    task=task if isinstance(task, str) else None))


@FUZZ
@given(tid=task_ids, worker=st.one_of(st.just("w9"), hostile_text, wrong), ttl=ttls)
def test_claim_get_release_redrive(world: World, tid: Any, worker: Any, ttl: Any) -> None:
    world.reset()
    q, tid = world.q, _tid(world, tid)
    attempt(world.raw, lambda: q.claim(tid, worker, ttl=ttl))
    world.reset()
    attempt(world.raw, lambda: q.get(tid))
    attempt(world.raw, lambda: q.release(tid, worker=worker if worker != "w9" else None))
    attempt(world.raw, lambda: q.release(tid, token=ttl, reason=worker if isinstance(worker, str) else "r"))
    world.reset()
    attempt(world.raw, lambda: q.redrive(tid))


@FUZZ
@given(worker=st.one_of(st.just("w9"), hostile_text, wrong), ttl=ttls,
       wait=st.one_of(st.sampled_from([0, 0.0, 0.01]), wrong, st.floats(max_value=-0.001)),
       batch=st.one_of(st.sampled_from([1, 1000]), numbers))
def test_claim_next_and_redrive_all(world: World, worker: Any, ttl: Any, wait: Any, batch: Any) -> None:
    world.reset()
    attempt(world.raw, lambda: world.q.claim_next(worker, ttl=ttl, wait=wait))
    world.reset()
    attempt(world.raw, lambda: world.q.redrive(None, batch=batch))


@FUZZ
@given(kind=LEASES, ttl=ttls, checkpoint=hostile_json, error=st.one_of(hostile_text, wrong),
       retry=st.one_of(st.booleans(), wrong))
def test_lease_operations(world: World, kind: str, ttl: Any, checkpoint: Any, error: Any, retry: Any) -> None:
    q = world.q
    for op in (lambda ls: q.renew(ls, ttl=ttl), lambda ls: q.save_checkpoint(ls, checkpoint),
               lambda ls: q.complete(ls), lambda ls: q.fail(ls, error, retry=retry),
               lambda ls: q.complete_and_claim(ls, ttl=ttl)):
        world.reset()
        lease = world.lease_like(kind)
        attempt(world.raw, lambda op=op, lease=lease: op(lease))


item_pairs = st.one_of(
    st.lists(st.tuples(st.one_of(st.just("k"), hostile_text, wrong), hostile_json), max_size=3),
    st.lists(st.sampled_from([("k",), ("a", {}, "c"), "ab", None, {"k": {}}]), min_size=1, max_size=2),
    wrong, hostile_text,
)


@FUZZ
@given(kind=st.sampled_from(["real", "real", "stale", "none", "str_token"]), items=item_pairs,
       checkpoint=st.one_of(st.none(), hostile_dict), good_first=st.booleans())
def test_commit(world: World, kind: str, items: Any, checkpoint: Any, good_first: bool) -> None:
    """A bad item anywhere (or a bad checkpoint) stores none of the call's items."""
    world.reset()
    if good_first and isinstance(items, list):
        items = [("good", {"v": 1}), *items]
    lease = world.lease_like(kind)
    attempt(world.raw, lambda: world.q.commit(lease, items, checkpoint))


def test_known_holes_are_typed() -> None:
    """The hostile-input review's findings, one by one (no Redis needed: all refused up front)."""
    q = TaskQueue(redis.Redis(port=1), "fz")  # nothing listens there: a write would fail loudly
    lease = Lease("abcdefghijkl", 1, "w", 0.0, task=None)  # type: ignore[arg-type]
    cases = [
        lambda: q.enqueue("http://example.com/\ud800"),
        lambda: q.enqueue("http://example.com/", meta={"a": "\ud800"}),
        lambda: q.enqueue("http://example.com/", meta={"deep": nested(2000)}),
        lambda: q.enqueue("http://example.com/", meta={"deep": nested(MAX_JSON_DEPTH + 1, kind="dict")}),
        lambda: q.save_checkpoint(lease, {"a": "\ud800"}),
        lambda: q.commit(lease, [("\ud800", {})]),
        lambda: q.enqueue_many(5),
        lambda: q.commit(lease, 5),
        lambda: q.renew(None),
        lambda: q.complete(None),
        lambda: q.fail(None, "x"),
        lambda: q.save_checkpoint(None, {}),
        lambda: q.enqueue_many(["http://example.com/"], batch_size=float("inf")),
        lambda: q.enqueue_many(["http://example.com/"], batch_size=float("nan")),
        lambda: q.claim(b"x", "w"), lambda: q.claim(5, "w"), lambda: q.claim(None, "w"),
        lambda: q.claim(["x"], "w"), lambda: q.get(b"x"), lambda: q.release(5), lambda: q.redrive(["x"]),
        lambda: q.claim_next("w", wait=float("inf")),
    ]
    for case in cases:
        with pytest.raises(InvalidInput):
            case()


@FUZZ
@given(tid=task_ids, ids=st.one_of(st.lists(task_ids, max_size=3), wrong, hostile_text),
       limit=small_ints, offset=small_ints, window=small_ints,
       after=st.one_of(st.sampled_from([0, 0.5, 60]), numbers), batch=small_ints)
def test_reading_and_maintenance_calls(world: World, tid: Any, ids: Any, limit: Any, offset: Any,
                                       window: Any, after: Any, batch: Any) -> None:
    """checkpoint, get_many, dead, dispatch and reclaim_expired: typed errors, nothing written."""
    world.reset()
    q = world.q
    attempt(world.raw, lambda: q.checkpoint(_tid(world, tid)))
    attempt(world.raw, lambda: q.get_many([_tid(world, i) for i in ids] if isinstance(ids, list) else ids))
    attempt(world.raw, lambda: q.dead(limit=limit, offset=offset))
    world.reset()
    attempt(world.raw, lambda: q.dispatch(window, redispatch_after=after, promote_limit=batch or 1))
    world.reset()
    attempt(world.raw, lambda: q.reclaim_expired(batch=batch, max_batches=limit or 1))


@pytest.mark.parametrize("options", [
    {"namespace": "bad ns"}, {"namespace": "a\n"}, {"lease_ttl": 0}, {"lease_ttl": float("inf")},
    {"lease_ttl": "30"}, {"backoff_base": -1}, {"backoff_cap": float("nan")}, {"history_max": -1},
    {"history_age": None}, {"checkpoint_cap": 10**9}, {"meta_cap": 0}, {"replica_timeout": 0},
])
def test_queue_options_are_checked(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        TaskQueue(redis.Redis(port=1), **options)
