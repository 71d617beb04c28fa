"""Hypothesis stateful test: random interleavings of every queue operation keep DESIGN §2's invariants.

Leases are short (50 ms), so real lease expiry and reclaim happen during runs, while stale holders keep
trying to write. After every step: each task sits in exactly one structure (its record's), counts are
conserved, a LeaseLost is only ever raised to a holder that really lost, and no task completes twice.
"""

from __future__ import annotations

import time

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from celery_ha import LeaseLost, TaskQueue
from celery_ha.runtime.redis_process import RedisProcess
from tests.support.invariants import check_invariants
from tests.support.records import has_record

URLS = [f"https://example.com/page/{i}" for i in range(12)]
TTL = 0.05
PICK = st.integers(0, 10**6)  # an index taken modulo the live list: draws never depend on timing


class QueueMachine(RuleBasedStateMachine):
    server: RedisProcess  # set by the test below

    def __init__(self) -> None:
        super().__init__()
        self.r = redis.Redis.from_url(self.server.url, decode_responses=True)
        self.r.flushall()
        self.q = TaskQueue.from_url(self.server.url, lease_ttl=TTL, max_attempts=2, max_stalls=1,
                                    backoff_base=0.001, backoff_cap=0.005)
        self.ids: set[str] = set()
        self.leases: list = []
        self.completed: set[str] = set()
        self.url_of: dict[str, str] = {}  # dedup ids -> their URL (an enqueue of it again recrawls)
        self.recrawls = 0  # new runs of completed tasks: each adds one lifetime completion to stats

    def teardown(self) -> None:
        self.r.close()
        self.q.client.close()

    def _current(self, lease) -> bool:
        info = self.q.get(lease.task_id)
        return info.state == "running" and info.token == lease.token

    def _fenced(self, lease, action) -> bool:
        was_current = self._current(lease)
        try:
            action()
        except LeaseLost:
            assert not self._current(lease), "LeaseLost raised to the current holder"
            return False
        assert was_current, "a stale holder's write was accepted"
        return True

    @rule(url=st.sampled_from(URLS), priority=st.integers(-2, 2), dedup=st.booleans())
    def enqueue(self, url: str, priority: int, dedup: bool) -> None:
        tid = self.q.enqueue(url, priority=priority, dedup=dedup)
        if dedup:
            self.url_of[tid] = url
        if dedup and tid in self.ids:
            return
        assert tid not in self.ids
        self.ids.add(tid)

    @rule(worker=st.sampled_from(["w1", "w2", "w3"]))
    def claim_next(self, worker: str) -> None:
        lease = self.q.claim_next(worker)
        if lease is not None:
            assert lease.task_id not in self.completed
            self.leases.append(lease)

    @rule(window=st.integers(0, 4))
    def dispatch(self, window: int) -> None:
        before = self.q.stats()["dispatched"]
        sent = self.q.dispatch(window, redispatch_after=0.02)
        assert len({d.task_id for d in sent}) == len(sent)
        assert self.q.stats()["dispatched"] <= max(window, before)

    @rule(pick=PICK, worker=st.sampled_from(["w1", "w2"]))
    def claim_by_id(self, pick: int, worker: str) -> None:
        if not self.ids:
            return
        tid = sorted(self.ids)[pick % len(self.ids)]
        before = self.q.get(tid).state if has_record(self.r, self.q.keys, tid) else None
        lease = self.q.claim(tid, worker)
        assert (lease is not None) == (before in ("queued", "dispatched"))
        if lease is not None:
            self.leases.append(lease)

    def _pick(self, pick: int):
        return self.leases[pick % len(self.leases)] if self.leases else None

    @rule(pick=PICK)
    def renew(self, pick: int) -> None:
        if (lease := self._pick(pick)) is None:
            return
        self._fenced(lease, lambda: self.q.renew(lease))

    @rule(pick=PICK, page=st.integers(0, 100))
    def checkpoint(self, pick: int, page: int) -> None:
        if (lease := self._pick(pick)) is None:
            return
        if self._fenced(lease, lambda: self.q.save_checkpoint(lease, {"page": page})):
            assert self.q.checkpoint(lease.task_id) == {"page": page}

    @rule(pick=PICK)
    def complete(self, pick: int) -> None:
        if (lease := self._pick(pick)) is None:
            return
        if self._fenced(lease, lambda: self.q.complete(lease)):
            assert lease.task_id not in self.completed, "completed twice"
            self.completed.add(lease.task_id)
            assert self.q.checkpoint(lease.task_id) is None

    @rule(pick=PICK)
    def complete_and_claim(self, pick: int) -> None:
        if (lease := self._pick(pick)) is None:
            return
        nxt = []
        if self._fenced(lease, lambda: nxt.append(self.q.complete_and_claim(lease))):
            assert lease.task_id not in self.completed, "completed twice"
            self.completed.add(lease.task_id)
            if nxt[0] is not None:
                assert nxt[0].task_id not in self.completed
                self.leases.append(nxt[0])

    @rule(pick=PICK, retry=st.booleans())
    def fail(self, pick: int, retry: bool) -> None:
        if (lease := self._pick(pick)) is None:
            return
        self._fenced(lease, lambda: self.q.fail(lease, "boom", retry=retry))

    @rule(pick=PICK, stall=st.booleans())
    def release(self, pick: int, stall: bool) -> None:
        if (lease := self._pick(pick)) is None:
            return
        current = self._current(lease)
        result = self.q.release(lease.task_id, token=lease.token, count_stall=stall)
        assert (result is not None) == current

    @rule()
    def let_leases_expire_and_reclaim(self) -> None:
        time.sleep(TTL + 0.01)
        self.q.reclaim_expired()
        assert self.q.stats()["running"] == 0 or all(
            s >= self._redis_ms() for _, s in self.r.zrange(self.q.keys.running, 0, -1, withscores=True))

    @rule(one=st.booleans(), pick=PICK)
    def redrive(self, one: bool, pick: int) -> None:
        dead = [t.id for t in self.q.dead()]
        if one and dead:
            assert self.q.redrive(dead[pick % len(dead)]) == 1
        elif not one:
            self.q.redrive()
            assert self.q.stats()["dead"] == 0

    @rule(pick=PICK, via_enqueue=st.booleans())
    def recrawl(self, pick: int, via_enqueue: bool) -> None:
        """A completed task starts a new run: by ``recrawl`` or by enqueueing its URL past a window of
        0 s; stale holders of its earlier runs keep trying to write (the fencing rules above)."""
        done = sorted(t for t in self.completed if not via_enqueue or t in self.url_of)
        if not done:
            return
        tid = done[pick % len(done)]
        if via_enqueue:
            assert self.q.enqueue_many_with_status([self.url_of[tid]], recrawl_after=0) == [(tid, True)]
        else:
            assert self.q.recrawl([tid]) == {tid: "queued"}
        self.completed.discard(tid)
        self.recrawls += 1

    def _redis_ms(self) -> float:
        sec, usec = self.r.time()
        return sec * 1000 + usec / 1000

    @invariant()
    def invariants_hold(self) -> None:
        states = check_invariants(self.r, self.q)
        assert set(states) == self.ids  # nothing lost, nothing invented (history is not trimmed here)
        s = self.q.stats()
        total = s["queued"] + s["dispatched"] + s["running"] + s["delayed"] + s["dead"] + s["completed"]
        assert total == len(self.ids) + self.recrawls
        assert {t for t, code in states.items() if code == "c"} == self.completed


@pytest.mark.timeout(600)
def test_queue_state_machine(redis_server: RedisProcess) -> None:
    QueueMachine.server = redis_server
    run = QueueMachine.TestCase()
    run.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                            suppress_health_check=list(HealthCheck), derandomize=False)
    run.runTest()


HOSTS = ["a.example", "b.example:8080", "c.example"]
HOST_URLS = [f"http://{h}/p/{i}" for h in HOSTS for i in range(5)]


class HostQueueMachine(QueueMachine):
    """The same interleavings with the host gate on: tasks of three hosts (plus example.com) under
    limits, blocks and budgets that change between steps, cancels, the gate switched off and on, and
    what the fetcher reports of a host. After every step the invariants above hold, the gate's books
    (queues, active and dispatched counts, the indexes, no host parked for an event it no longer
    needs) agree with the records (``check_hosts``), and the switch is where the operator left it."""

    def __init__(self) -> None:
        super().__init__()
        self.q = TaskQueue.from_url(self.server.url, lease_ttl=TTL, max_attempts=2, max_stalls=1,
                                    backoff_base=0.001, backoff_cap=0.005, host_gate=True)
        self.gate_on = True  # as the operator (or this process's host_gate) last set it

    @rule(url=st.sampled_from(HOST_URLS), priority=st.integers(-2, 2), dedup=st.booleans(),
          own_host=st.booleans())
    def enqueue_hosted(self, url: str, priority: int, dedup: bool, own_host: bool) -> None:
        tid = self.q.enqueue(url, priority=priority, dedup=dedup, host="custom-key" if own_host else None)
        if dedup:
            self.url_of[tid] = url
        if dedup and tid in self.ids:
            return
        assert tid not in self.ids
        self.ids.add(tid)

    @rule(host=st.sampled_from(HOSTS), concurrency=st.sampled_from([None, 0, 1, 2]),
          delay=st.sampled_from([None, 0, 0.01]), budget=st.sampled_from([None, 2, 50]),
          rate=st.sampled_from([None, "100/1"]))
    def set_limits(self, host: str, concurrency, delay, budget, rate) -> None:
        self.q.hosts.set(host, concurrency=concurrency, delay=delay, budget=budget, rate=rate)
        self.gate_on = True

    @rule(concurrency=st.sampled_from([None, 1, 3]), budget=st.sampled_from([None, 0, 2, 50]))
    def set_defaults(self, concurrency, budget) -> None:
        self.q.hosts.set_defaults(concurrency=concurrency, budget=budget)
        self.gate_on = True

    @rule(on=st.booleans())
    def switch(self, on: bool) -> None:
        self.q.hosts.switch(on)
        self.gate_on = on

    @rule(host=st.sampled_from(HOSTS), how=st.integers(0, 2))
    def fetcher_reports(self, host: str, how: int) -> None:
        """The fetcher's calls around a gated task's request: they never switch the gate."""
        if how == 0:
            self.q.hosts.request(host)
        elif how == 1:
            self.q.hosts.finished(host)
        else:
            self.q.hosts.set_crawl_delay(host, 0.01)

    @rule(host=st.sampled_from(HOSTS), seconds=st.sampled_from([0.0, 0.01, 0.05]), how=st.integers(0, 3))
    def block(self, host: str, seconds: float, how: int) -> None:
        if how == 0:
            self.q.hosts.block(host, seconds)
            self.gate_on = True
        elif how == 1:
            self.q.hosts.unblock(host)
            self.gate_on = True
        elif how == 2:
            self.q.hosts.backoff(host, "429", start=seconds or 0.01, cap=0.05)
        else:
            self.q.hosts.defer(host, seconds)

    @rule(pick=PICK, worker=st.sampled_from(["w1", "w2"]))
    def claim_by_id(self, pick: int, worker: str) -> None:
        """As above, but a dispatched task whose host is blocked now gets no lease: it goes back to
        its host's queue (and the claim says so with None); and a queued task whose host may not
        start a task now (blocked, at its concurrency, paced) gets none either: it stays queued."""
        if not self.ids:
            return
        tid = sorted(self.ids)[pick % len(self.ids)]
        before = self.q.get(tid) if has_record(self.r, self.q.keys, tid) else None
        blocked = before is not None and before.host is not None and \
            self.q.hosts.get(before.host).blocked_until is not None
        lease = self.q.claim(tid, worker)
        state = before.state if before is not None else None
        if state == "dispatched" and blocked and lease is None:
            assert self.q.get(tid).state == "queued"
        elif state == "queued" and before.host is not None and lease is None:
            assert self.q.get(tid).state == "queued"  # its host was not due: the gate holds it
        else:
            assert (lease is not None) == (state in ("queued", "dispatched"))
        if lease is not None:
            self.leases.append(lease)

    @rule(pick=PICK)
    def cancel(self, pick: int) -> None:
        if not self.ids:
            return
        tid = sorted(self.ids)[pick % len(self.ids)]
        self.q.cancel(tid, "test")

    @invariant()
    def the_switch_is_where_the_operator_left_it(self) -> None:
        if self.r.exists(self.q.keys.host_config):  # written at this process's first call
            assert self.q.hosts.enabled() == self.gate_on


@pytest.mark.timeout(600)
def test_host_gate_state_machine(redis_server: RedisProcess) -> None:
    HostQueueMachine.server = redis_server
    run = HostQueueMachine.TestCase()
    run.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                            suppress_health_check=list(HealthCheck), derandomize=False)
    run.runTest()
