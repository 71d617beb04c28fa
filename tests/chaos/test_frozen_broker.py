"""A broker that stops answering without closing its sockets (SIGSTOP: a frozen VM, a long pause, a
partition without RST) must not stall the crawl: every broker call is bounded in time
(``integration/dispatch/broker.py`` ``broker_timeout``), and the lease keeper never waits on the broker.

- Sentinel: the master (state and broker alike) is SIGSTOPped and kept frozen for 30 s after the
  replica's promotion. Work is claimed and completed on the new master within seconds of the
  promotion, long before the old master thaws; then it thaws, is demoted to a replica, and the
  crawl ends with every page stored exactly once and nothing dead.
- Plain Redis: a broker of its own (the state Redis stays up) is SIGSTOPped for longer than several
  lease TTLs. No lease expires meanwhile (the renewals go on), nothing is reclaimed or charged a
  stall, and the crawl finishes once the broker answers again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.redisio.client import redis_client
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.sink import iter_items
from tests.support.celery_helpers import Cluster, wait_for
from tests.support.sentinel import MASTER_NAME, SentinelGroup

pytestmark = pytest.mark.slow

#: Seconds the old Sentinel master stays frozen after the promotion.
FROZEN_AFTER_PROMOTION = 30.0


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis").start()
    yield group
    group.stop()


def _unfinished(cluster: Cluster, ids: list[str]) -> list[tuple[str, str]]:
    return [(i.id if i else "?", i.state if i else "missing") for i in cluster.q.get_many(ids)
            if i is None or i.state != "completed"]


def _diagnosis(cluster: Cluster, ids: list[str], procs: list) -> str:
    """What a failed run needs to be understood: unfinished tasks and the tail of every log."""
    try:
        left = _unfinished(cluster, ids)[:10]
    except Exception as exc:
        left = [("state unreadable", str(exc))]
    logs = "\n".join(f"--- {p.args[-1]} exit={p.poll()}\n{cluster.log_text(p)[-2500:]}" for p in procs)
    return f"unfinished: {left}\n{logs}"


def _watcher(cluster: Cluster) -> TaskQueue:
    """The test's own view of the state, with short timeouts: the cluster's client may wait 10 s on
    the frozen master before it asks the sentinels again, which would blur what is measured."""
    client = redis_client(cluster.state_url, sentinel_master=MASTER_NAME, socket_timeout=0.5,
                          socket_connect_timeout=0.5)
    return TaskQueue(client, cluster.namespace)


def _completed(q: TaskQueue) -> int | None:
    try:
        return int(q.stats()["completed"])
    except (redis.RedisError, OSError):  # still finding the new master
        return None


def _alive(pid: int) -> bool:
    """Whether pool process ``pid`` still runs (one that exited, or was replaced, beats no more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exactly_once(cluster: Cluster, ids: list[str], urls: list[str]) -> None:
    """0 missing, 0 duplicates, 0 dead; no attempt was charged for the outage."""
    assert not _unfinished(cluster, ids)
    keys = [key for key, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert len(keys) == len(set(keys)), "an item was stored twice"
    assert set(keys) == set(urls), "pages are missing from the sink"
    stats = cluster.q.stats()
    assert stats["dead"] == 0, stats
    charged = [(i.id, i.attempts, i.error) for i in cluster.q.get_many(ids) if i.attempts]
    assert not charged, charged


def test_a_sentinel_master_frozen_long_after_the_promotion_does_not_stall_the_crawl(
        make_cluster, site, sentinels, monkeypatch):
    monkeypatch.setenv("CELERY_HA_SENTINEL_MASTER", MASTER_NAME)
    cluster = make_cluster(state_url=sentinels.db_url(0), broker_url=sentinels.db_url(1),
                           CELERY_HA_SENTINEL_MASTER=MASTER_NAME, CELERY_HA_LEASE_TTL="3",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_MAX_STALLS="10")
    site.delays["/case/"] = 1.0  # 4 pool processes: about 4 pages a second, work left at the thaw
    # Celery's heartbeat events on, as in production: a synchronous PUBLISH of one used to hold each
    # worker's event loop on the frozen master until it thawed.
    workers = [cluster.worker("w1", concurrency=2, heartbeat=True),
               cluster.worker("w2", concurrency=2, heartbeat=True)]
    beat = cluster.beat()
    procs = [*workers, beat]
    urls = [site.case_url(n) for n in range(200)]
    ids = cluster.q.enqueue_many(urls)
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 8, timeout=60, message="8 pages before the freeze")

    old = sentinels.current_master()
    frozen_at = time.monotonic()
    sentinels.pause_master()
    try:
        sentinels.wait_promoted(old.port)
        promoted_at = time.monotonic()
        watcher = _watcher(cluster)
        done_at_promotion = wait_for(lambda: _completed(watcher), timeout=20, interval=0.1,
                                     message="the new master to answer the test")
        thaw_at = promoted_at + FROZEN_AFTER_PROMOTION
        try:
            wait_for(lambda: (_completed(watcher) or 0) > done_at_promotion,
                     timeout=FROZEN_AFTER_PROMOTION - 5, interval=0.1,
                     message="a page completed on the new master while the old one is frozen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, procs)}") from None
        first_done = time.monotonic() - promoted_at
        wait_for(lambda: time.monotonic() >= thaw_at, timeout=FROZEN_AFTER_PROMOTION + 5, interval=0.2,
                 message="the freeze to last 30 s after the promotion")  # the freeze itself is tested
        done_in_freeze = (_completed(watcher) or done_at_promotion) - done_at_promotion
    finally:
        assert old.proc is not None
        old.proc.send_signal(signal.SIGCONT)
    thawed_at = time.monotonic()

    # The thawed master learns from the sentinels that it is a replica now.
    demoted = redis.Redis(host="127.0.0.1", port=old.port, socket_timeout=2)
    wait_for(lambda: demoted.info("replication").get("role") == "slave", timeout=30, interval=0.2,
             message="the old master to be demoted to a replica")
    try:
        wait_for(lambda: not _unfinished(cluster, ids), timeout=120, interval=0.5,
                 message="the crawl to drain")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, procs)}") from None
    _exactly_once(cluster, ids, urls)
    died = [proc for proc in procs if proc.poll() is not None]
    assert not died, f"processes died and needed a restart\n{_diagnosis(cluster, ids, procs)}"
    print(f"Sentinel master frozen: promoted {promoted_at - frozen_at:.1f}s after the freeze; first page "
          f"completed on the new master {first_done:.1f}s after the promotion; {done_in_freeze} pages "
          f"completed during the {FROZEN_AFTER_PROMOTION:.0f}s freeze; crawl drained "
          f"{time.monotonic() - thawed_at:.1f}s after the thaw")


#: Seconds the plain Redis broker stays frozen: several lease TTLs (3 s) and sweep intervals.
BROKER_FROZEN = 12.0


def test_a_frozen_redis_broker_loses_no_lease_and_the_crawl_resumes(make_cluster, site, broker_redis):
    """Beat cannot send its sweeps meanwhile, so the pool processes' watchdogs sweep themselves, and
    a sweep talks to the broker: it must never hold the renewals (it used to run in the keeper)."""
    cluster = make_cluster(broker_url=broker_redis.url, CELERY_HA_LEASE_TTL="3",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_RECLAIM_INTERVAL="1",
                           CELERY_HA_WINDOW="4")
    site.delays["/case/"] = 2.0  # tasks are running when the broker stops
    worker = cluster.worker("w1", concurrency=2)
    beat = cluster.beat()
    procs = [worker, beat]
    urls = [site.case_url(n) for n in range(16)]
    ids = cluster.q.enqueue_many(urls)
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["running"] >= 2, timeout=30, message="two tasks running")

    keys = QueueKeys(cluster.namespace)
    expired: list[tuple[str, float]] = []  # (task id, seconds its lease was past its expiry)
    silent: list[tuple[str, float]] = []  # (pool process, seconds since its last heartbeat)
    running_seen: set[str] = set()

    def watch_the_state() -> bool:
        now = redis_now_ms(cluster.r)
        for task_id, expires in cluster.r.zrange(keys.running, 0, -1, withscores=True):
            running_seen.add(task_id)
            if expires < now:
                expired.append((task_id, (now - expires) / 1000))
        for name, beat in cluster.r.zrange(keys.workers, 0, -1, withscores=True):
            node, _, pid = name.rpartition(":")
            if node == worker.node and now - beat > 3000 and _alive(int(pid)):  # type: ignore[attr-defined]
                silent.append((name, (now - beat) / 1000))
        return time.monotonic() >= resume_at

    assert broker_redis.proc is not None
    broker_redis.proc.send_signal(signal.SIGSTOP)
    resume_at = time.monotonic() + BROKER_FROZEN
    try:
        wait_for(watch_the_state, timeout=BROKER_FROZEN + 10, interval=0.2,
                 message="the broker's freeze to end")  # the freeze itself is what is tested
    finally:
        broker_redis.proc.send_signal(signal.SIGCONT)
    during = cluster.q.stats()
    assert not expired, f"leases expired while the broker was frozen: {expired[:5]}\n" \
                        f"{_diagnosis(cluster, ids, procs)}"
    assert not silent, f"lease keepers stopped beating while the broker was frozen: {silent[:5]}\n" \
                       f"{_diagnosis(cluster, ids, procs)}"
    assert during["reclaimed"] == 0, during

    try:
        first, drained = cluster.recovery(ids, "the broker's thaw", timeout=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, procs)}") from None
    _exactly_once(cluster, ids, urls)
    stats = cluster.q.stats()
    assert stats["reclaimed"] == 0, stats
    stalled = [(i.id, i.stalls) for i in cluster.q.get_many(ids) if i.stalls]
    assert not stalled, stalled
    assert all(proc.poll() is None for proc in procs), _diagnosis(cluster, ids, procs)
    print(f"Redis broker frozen {BROKER_FROZEN:.0f}s (lease TTL 3 s): {len(running_seen)} task(s) held a "
          f"lease during the freeze, none expired, 0 reclaimed; first page {first:.1f}s after the thaw, "
          f"crawl finished {drained:.1f}s after it")
