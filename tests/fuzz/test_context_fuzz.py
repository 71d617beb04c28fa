"""Fuzz what a durable task function calls on ``ctx``: emit, enqueue and save_checkpoint.

A refusal must be typed, write nothing, and leave the context usable: a bad call never poisons the
buffer, so the next good checkpoint still commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from celery_ha.base.settings import Settings
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.running.context import DurableContext
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from tests.fuzz.hostile import (
    FUZZ,
    attempt,
    hostile_dict,
    hostile_json,
    hostile_text,
    hostile_url,
    numbers,
    wrong,
)


class World:
    def __init__(self, url: str) -> None:
        self.raw = redis.Redis.from_url(url)
        client = redis_client(url)
        self.q = TaskQueue(client, "fz", lease_ttl=30)
        self.rt = Services(settings=Settings(redis_url=url, namespace="fz"), redis_url=url, client=client,
                           queue=self.q)

    def context(self, item_key: str | None = None) -> DurableContext:
        self.raw.flushdb()
        tid = self.q.enqueue("http://example.test/parent", task="unit_task")
        lease = self.q.claim(tid, "unit@host:1")
        assert lease is not None
        return DurableContext(lease, self.rt, DurableTask(name="unit_task", fn=lambda c: None,
                                                          item_key=item_key))


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    w = World(redis_url)
    yield w
    w.raw.close()


def _still_usable(world: World, ctx: DurableContext) -> None:
    """After any refusals, a good checkpoint commits everything accepted so far."""
    ctx.save_checkpoint({"done": True})
    assert world.q.checkpoint(ctx.task_id) == {"done": True}


@FUZZ
@given(item=st.one_of(hostile_json, st.builds(lambda d: {"id": d}, st.one_of(hostile_text, wrong))),
       key=st.one_of(st.none(), st.just("k1"), hostile_text, wrong),
       item_key=st.sampled_from([None, "id"]))
def test_emit(world: World, item: Any, key: Any, item_key: str | None) -> None:
    ctx = world.context(item_key)
    attempt(world.raw, lambda: ctx.emit(item, key=key))
    _still_usable(world, ctx)


@FUZZ
@given(url=hostile_url, task=st.one_of(st.none(), st.just("child"), hostile_text, wrong),
       priority=st.one_of(st.just(0), numbers), meta=st.one_of(st.none(), hostile_json),
       dedup=st.booleans(), max_attempts=st.one_of(st.none(), st.just(2), numbers))
def test_enqueue_child(world: World, url: Any, task: Any, priority: Any, meta: Any, dedup: bool,
                       max_attempts: Any) -> None:
    ctx = world.context()
    attempt(world.raw, lambda: ctx.enqueue(url, task=task, priority=priority, meta=meta, dedup=dedup,
                                           max_attempts=max_attempts))
    _still_usable(world, ctx)


@FUZZ
@given(checkpoint=st.one_of(hostile_dict, hostile_json), buffered=st.booleans())
def test_save_checkpoint(world: World, checkpoint: Any, buffered: bool) -> None:
    """A refused checkpoint writes neither the buffered items nor the buffered children."""
    ctx = world.context()
    if buffered:
        ctx.emit({"n": 1}, key="k")
        ctx.enqueue("http://example.test/child")
    attempt(world.raw, lambda: ctx.save_checkpoint(checkpoint))
    _still_usable(world, ctx)
