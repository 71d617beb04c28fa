"""Redis high availability end to end: real Celery workers and beat on a Sentinel deployment (state
and broker alike), the master SIGKILLed mid-crawl. Nobody restarts anything: the crawl drains, every
page's item is stored exactly once, and only the pages the site answers 404 end dead."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ha.state.sink import iter_items
from tests.support.celery_helpers import wait_for
from tests.support.sentinel import MASTER_NAME, SentinelGroup

pytestmark = pytest.mark.slow

PAGES = 120
GONE = {7, 33, 71}  # the site answers 404: these, and only these, end dead


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis").start()
    yield group
    group.stop()


def _diagnosis(cluster, ids: list[str], procs: list) -> str:
    """What a failed run needs to be understood: unfinished tasks and the tail of every log."""
    try:
        left = [(i.id, i.state, i.attempts, i.stalls, i.error) for i in cluster.q.get_many(ids)
                if i is None or i.state not in ("completed", "dead")][:10]
    except Exception as exc:
        left = [f"state unreadable: {exc}"]
    logs = "\n".join(f"--- {p.args[-1] if hasattr(p, 'args') else p} exit={p.poll()}\n"
                     f"{cluster.log_text(p)[-1500:]}" for p in procs)
    return f"unfinished: {left}\n{logs}"


def _finished(cluster, ids: list[str]) -> bool:
    infos = cluster.q.get_many(ids)
    return all(info is not None and info.state in ("completed", "dead") for info in infos)


@pytest.mark.parametrize("min_replicas", [0, 1], ids=["async", "wait-for-replica"])
def test_crawl_drains_exactly_once_across_a_master_kill(make_cluster, site, sentinels, monkeypatch,
                                                        min_replicas):
    """With ``CELERY_HA_MIN_REPLICAS=1`` every transition before the kill was on the replica; after
    it the promoted master has no replica left, so each WAIT ends at its (short) timeout."""
    monkeypatch.setenv("CELERY_HA_SENTINEL_MASTER", MASTER_NAME)
    cluster = make_cluster(state_url=sentinels.db_url(0), broker_url=sentinels.db_url(1),
                           CELERY_HA_SENTINEL_MASTER=MASTER_NAME, CELERY_HA_LEASE_TTL="4",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_MAX_STALLS="10",
                           CELERY_HA_MIN_REPLICAS=str(min_replicas), CELERY_HA_REPLICA_TIMEOUT="0.05")
    site.delays["/case/"] = 0.05
    for n in GONE:
        site.fail(f"/case/{n}", "404")
    workers = [cluster.worker("w1", concurrency=2), cluster.worker("w2", concurrency=2)]
    beat = cluster.beat()
    urls = [site.case_url(n) for n in range(PAGES)]
    ids = cluster.q.enqueue_many(urls)
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 30, timeout=60, message="30 pages before the kill")

    old = sentinels.master_address()[1]
    done_at_kill = cluster.q.stats()["completed"]
    killed_at = sentinels.kill_master()
    sentinels.wait_promoted(old)
    promoted_at = time.monotonic()
    first_done: list[float] = []

    def finished_on_new_master() -> bool:
        try:
            if not first_done and cluster.q.stats()["completed"] > done_at_kill:
                first_done.append(time.monotonic())
            return _finished(cluster, ids)
        except Exception:  # the test's own client may still be finding the new master
            return False

    try:
        wait_for(finished_on_new_master, timeout=120, interval=0.5, message="the crawl to drain")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, [*workers, beat])}") from None
    drained_at = time.monotonic()

    items = list(iter_items(cluster.r, cluster.namespace, with_keys=True))
    keys = [key for key, _ in items]
    assert len(keys) == len(set(keys)), "an item was stored twice"
    expected = {site.case_url(n) for n in range(PAGES) if n not in GONE}
    assert set(keys) == expected
    dead = {info.url for info in cluster.q.dead(limit=1000)}
    assert dead == {site.case_url(n) for n in GONE}
    # No process died: kombu's Redis transport used to raise AttributeError on a channel of the
    # connection the consumer had just closed, which ended the worker (integration/patches/kombu_fixes.py).
    died = [proc for proc in [*workers, beat] if proc.poll() is not None]
    assert not died, f"processes died and needed a restart\n{_diagnosis(cluster, ids, [*workers, beat])}"
    print(f"failover ({min_replicas=}): promoted {promoted_at - killed_at:.1f}s after the kill, first "
          f"task completed on the new master {first_done[0] - killed_at:.1f}s after it, crawl drained "
          f"{drained_at - killed_at:.1f}s after it")


def test_a_paused_master_that_comes_back_causes_no_duplicate_output(make_cluster, site, sentinels,
                                                                    monkeypatch):
    """SIGSTOP the master for longer than the lease TTL: Sentinel promotes the replica and the crawl
    goes on there; then SIGCONT: the old master, demoted to a replica, discards what was written to
    it meanwhile. The surviving sink holds every page's item exactly once."""
    monkeypatch.setenv("CELERY_HA_SENTINEL_MASTER", MASTER_NAME)
    cluster = make_cluster(state_url=sentinels.db_url(0), broker_url=sentinels.db_url(1),
                           CELERY_HA_SENTINEL_MASTER=MASTER_NAME, CELERY_HA_LEASE_TTL="3",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_MAX_STALLS="10")
    site.delays["/case/"] = 0.05
    for n in GONE:
        site.fail(f"/case/{n}", "404")
    workers = [cluster.worker("w1", concurrency=2), cluster.worker("w2", concurrency=2)]
    beat = cluster.beat()
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(PAGES)])
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 30, timeout=60, message="30 pages before the pause")

    old = sentinels.master_address()[1]
    paused = sentinels.pause_master()
    sentinels.wait_promoted(old)
    resume_at = time.monotonic() + 4.0
    wait_for(lambda: time.monotonic() >= resume_at, timeout=10, message="the pause to outlast the TTL")
    assert paused.proc is not None
    paused.proc.send_signal(signal.SIGCONT)

    def finished() -> bool:
        try:
            return _finished(cluster, ids)
        except Exception:
            return False

    try:
        wait_for(finished, timeout=120, interval=0.5, message="the crawl to drain")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, [*workers, beat])}") from None
    keys = [key for key, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert len(keys) == len(set(keys)), "an item was stored twice"
    assert set(keys) == {site.case_url(n) for n in range(PAGES) if n not in GONE}
    assert {info.url for info in cluster.q.dead(limit=1000)} == {site.case_url(n) for n in GONE}
    assert all(proc.poll() is None for proc in [*workers, beat]), _diagnosis(cluster, ids, [*workers, beat])
