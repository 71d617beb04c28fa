"""The items sum behind ``ctx.signature()`` over a resumed run (``state/run_sum.py``), in process against a
real Redis: it equals a run from the start's whatever was committed before the crash, with or without a
checkpoint (``FLUSH_AT``); the reserved field it is kept in never shows in a checkpoint read back; a
checkpoint of an earlier release (no sum) gives no verdict rather than a wrong one. The crash with a
real worker is ``tests/chaos/test_signature_resume.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from celery_ha.base.errors import InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.running.context import FLUSH_AT, DurableContext
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from celery_ha.state.records import Lease
from celery_ha.state.run_sum import ITEMS_SUM
from celery_ha.state.sink import count_items

SPEC = DurableTask(name="sig_task", fn=lambda ctx: None)
ITEMS = FLUSH_AT + 40  # past one automatic flush


@pytest.fixture
def rt(redis_url: str) -> Iterator[Services]:
    client = redis_client(redis_url)
    q = TaskQueue(client, "sig", lease_ttl=30)
    yield Services(settings=Settings(redis_url=redis_url, namespace="sig", lease_ttl=30), redis_url=redis_url,
                   client=client, queue=q)
    client.close()


def _item(i: int) -> dict[str, object]:
    return {"n": i, "text": "same every run"}


def _context(rt: Services, tid: str) -> DurableContext:
    lease = rt.queue.claim(tid, "w:1")
    assert isinstance(lease, Lease)
    return DurableContext(lease, rt, SPEC)


def _crash(rt: Services, ctx: DurableContext) -> None:
    """The attempt's process dies: its lease is taken back (a stall), nothing more of it is written."""
    assert rt.queue.release(ctx.task_id, token=ctx.lease.token, count_stall=True) == "queued"


def test_a_resumed_run_signs_every_item_of_the_run_flushed_or_checkpointed(rt: Services, r: redis.Redis
                                                                           ) -> None:
    q = rt.queue
    # The run from the start, in a namespace of its own (its sink keeps the same keys apart).
    ref = Services(settings=rt.settings, redis_url=rt.redis_url, client=rt.client,
                   queue=TaskQueue(rt.client, "sigref", lease_ttl=30))
    full = _context(ref, ref.queue.enqueue("http://example.test/full", task="sig_task"))
    for i in range(ITEMS):
        full.emit(_item(i), key=f"k{i}")
    full.signature()
    expected = full.lease.verdict

    tid = q.enqueue("http://example.test/resumed", task="sig_task")
    first = _context(rt, tid)
    for i in range(10):
        first.emit(_item(i), key=f"k{i}")
    first.save_checkpoint({"i": 10})
    for i in range(10, 10 + FLUSH_AT + 5):  # a flush commits FLUSH_AT of them, with no checkpoint
        first.emit(_item(i), key=f"k{i}")
    assert first.committed == 10 + FLUSH_AT  # in the sink before the crash, the last 5 not
    _crash(rt, first)

    second = _context(rt, tid)
    assert second.checkpoint == {"i": 10} and q.checkpoint(tid) == {"i": 10}  # the user's view
    for i in range(second.checkpoint["i"], ITEMS):
        second.emit(_item(i), key=f"k{i}")
    assert second.signature() is None  # the task never signed before
    assert second.lease.verdict == expected  # as the run from the start signed it
    assert ITEMS_SUM in r.hget(q.keys.checkpoints, tid)  # kept beside it, in the same field
    second.flush()
    assert count_items(rt.client, "sig") == ITEMS  # each key once (the sink is keyed)

    # Two crashes, each after a checkpoint and more items: every attempt goes on from the stored sum.
    tid2 = q.enqueue("http://example.test/twice", task="sig_task")
    for resume, saved, crashed in ((0, 100, 200), (100, 300, 350), (300, None, ITEMS)):
        attempt = _context(rt, tid2)
        assert (attempt.checkpoint or {}).get("i", 0) == resume
        for i in range(resume, crashed):
            attempt.emit(_item(i), key=f"k{i}")
            if i + 1 == saved:
                attempt.save_checkpoint({"i": saved})
        if saved is not None:
            _crash(rt, attempt)
    attempt.signature()
    assert attempt.lease.verdict == expected


def test_the_reserved_field_is_refused_in_a_task_checkpoint(rt: Services) -> None:
    ctx = _context(rt, rt.queue.enqueue("http://example.test/reserved", task="sig_task"))
    with pytest.raises(InvalidInput, match="reserved"):
        ctx.save_checkpoint({ITEMS_SUM: "0"})
    ctx.save_checkpoint({})
    assert ctx.checkpoint == {} and rt.queue.checkpoint(ctx.task_id) == {}


def test_a_checkpoint_without_the_sum_gives_no_verdict(rt: Services) -> None:
    """Saved by a release before the sum was kept (here: the state API, which stores none)."""
    q = rt.queue
    tid = q.enqueue("http://example.test/old", task="sig_task")
    old = q.claim(tid, "w:1")
    assert old is not None
    q.commit(old, [("k0", _item(0))], {"i": 1})
    q.release(tid, token=old.token, count_stall=True)
    ctx = _context(rt, tid)
    assert ctx.checkpoint == {"i": 1}
    ctx.emit(_item(1), key="k1")
    assert ctx.signature() is None and ctx.lease.verdict == ""  # the items before it are unknown
    assert ctx.signature({"page": "body"}) is None and ctx.lease.verdict != ""  # data signs as before
