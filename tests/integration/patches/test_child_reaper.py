"""The internal ``child_reaper`` drives: billiard's ``Pool.maintain_pool`` replaces a dead child when
it is called, and nothing else does in a pool run from an event loop (``threads=False``, as Celery's
prefork pool is). If billiard renames it or stops replacing children there, this fails; the worker's
start-up line (``test_worker_startup.py``) shows that Celery's prefork pool exposes it where the
patch looks (``worker.pool._pool``); ``tests/chaos/test_failover.py`` times the failover it speeds."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from billiard.pool import Pool
from celery.concurrency.asynpool import AsynPool

from tests.support.polling import wait_until


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool(2, threads=False)  # no supervisor thread: the event loop's caller maintains it
    yield p
    # Pool.terminate() waits for the event loop's handlers, which this pool has none of: its
    # children are SIGKILLed and joined instead, and its exit-time terminate is cancelled.
    for worker in p._pool:
        os.kill(worker.pid, signal.SIGKILL)
    for worker in p._pool:
        worker.join(10)
    p._terminate.cancel()


def test_maintain_pool_replaces_a_sigkilled_child(pool: Pool) -> None:
    victim = pool._pool[0]
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: not victim.is_alive(), 10, 0.02, "the child to die")
    assert victim in pool._pool  # nobody but maintain_pool replaces it
    pool.maintain_pool()
    pids = [worker.pid for worker in pool._pool]
    assert victim.pid not in pids and len(pids) == 2
    wait_until(lambda: all(worker.is_alive() for worker in pool._pool), 10, 0.02, "the new child")


def test_celerys_prefork_pool_is_a_billiard_pool_with_maintain_pool() -> None:
    assert issubclass(AsynPool, Pool) and callable(AsynPool.maintain_pool)
