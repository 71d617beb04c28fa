"""The refill path of a completion: one script completes and dispatches, a background thread sends."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celery_ha import LeaseLost
from celery_ha.base.settings import Settings
from celery_ha.integration.core import services as svc
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.dispatch import pump
from celery_ha.integration.dispatch import sender as snd
from celery_ha.integration.running import lease_keeper
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.running.runner import run_message
from celery_ha.redisio.client import redis_client
from celery_ha.state import Dispatched, TaskQueue
from tests.state.test_queue import CountingConnection
from tests.support.fake_queues import fake_amqp
from tests.support.invariants import check_invariants


class Recorder:
    """Enough of a Celery app for ``pump.send``: records each message; ``gate`` can hold a publish."""

    def __init__(self, fail_first: int = 0) -> None:
        self.sent: list[list[str]] = []
        self.producers_taken = 0
        self.producers_held = 0
        self.threads: set[str] = set()
        self.sent_by: list[str] = []  # the thread of each message, in order
        self.fail_first = fail_first
        self.gate = threading.Event()
        self.gate.set()
        self.conf = SimpleNamespace(broker_url="memory://", broker_transport_options={})
        self.amqp = fake_amqp()

    @contextlib.contextmanager
    def producer_or_acquire(self) -> Iterator[SimpleNamespace]:
        self.producers_taken += 1
        self.producers_held += 1
        try:
            yield SimpleNamespace(name=f"producer-{self.producers_taken}", channel=object())
        finally:
            self.producers_held -= 1

    def send_task(self, name: str, args: list[str], **options: Any) -> None:
        producer = options["producer"]
        assert producer.name == f"producer-{self.producers_taken}" and self.producers_held == 1
        assert [queue.channel for queue in options["declare"]] == [producer.channel]  # bound once, passed
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.sent_by.append(threading.current_thread().name)
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("broker away")
        self.sent.append(list(args))


@pytest.fixture
def rt(redis_url: str) -> Iterator[Services]:
    settings = Settings(redis_url=redis_url, namespace="snd", lease_ttl=5, heartbeat_interval=1, window=3)
    client = redis_client(redis_url)
    runtime = Services(settings=settings, redis_url=redis_url, client=client,
                       queue=TaskQueue(client, "snd", lease_ttl=5))
    svc._services.set(runtime)
    svc.set_node("snd@host")
    sender = snd._sender.peek()
    if sender is not None:
        sender.task_cpu = 0.0  # each test starts with a process whose tasks used no CPU
    yield runtime
    assert snd.flush_sends(10)
    # The runner started this process's lease keeper for these services: stopped here, else its
    # heartbeat goes on writing this namespace's keys into the (flushed) server of later tests.
    lease_keeper.stop_keeper()
    lease_keeper._keeper.reset()
    svc.reset_services()


def _batch(*ids: str) -> list[Dispatched]:
    return [Dispatched(i, "fetch_page", 0, False) for i in ids]


def test_batches_go_out_in_order_from_the_sender_thread(rt: Services) -> None:
    app = Recorder()
    snd.send_soon(app, rt, _batch("a"))
    snd.send_soon(app, rt, _batch("b", "c"))
    snd.send_soon(app, rt, [])  # nothing to send: no message
    assert snd.flush_sends(10)
    assert app.sent == [["a"], ["b"], ["c"]]
    assert app.threads == {"celery-ha-sender"}
    assert app.producers_taken == 1  # one producer kept across the batches


def test_the_producer_goes_back_to_the_pool_when_idle_and_after_a_failure(
        rt: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snd, "PRODUCER_IDLE", 0.2)
    app = Recorder(fail_first=1)
    snd.send_soon(app, rt, _batch("lost"))  # the publish fails: its producer is given back
    snd.send_soon(app, rt, _batch("next"))  # a fresh one
    assert snd.flush_sends(10)
    assert app.sent == [["next"]] and app.producers_taken == 2
    deadline = time.monotonic() + 10
    while app.producers_held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.producers_held == 0  # idle: back in the pool
    snd.send_soon(app, rt, _batch("later"))
    assert snd.flush_sends(10)
    assert app.sent == [["next"], ["later"]] and app.producers_taken == 3


def test_a_failed_publish_is_logged_and_the_thread_goes_on(rt: Services,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    app = Recorder(fail_first=1)
    with caplog.at_level(logging.WARNING, logger="celery_ha.integration.dispatch.sender"):
        snd.send_soon(app, rt, _batch("lost"))
        snd.send_soon(app, rt, _batch("next"))
        assert snd.flush_sends(10)
    assert app.sent == [["next"]]
    assert "sending 1 dispatched task(s) failed" in caplog.text


def test_flush_waits_for_a_publish_in_progress_and_times_out(rt: Services) -> None:
    app = Recorder()
    app.gate.clear()  # the publish blocks (a broker that hangs)
    snd.send_soon(app, rt, _batch("slow"))
    assert not snd.flush_sends(0.2)
    app.gate.set()
    assert snd.flush_sends(10) and app.sent == [["slow"]]


def test_a_full_sender_queue_leaves_the_batch_to_redispatch(rt: Services, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(snd, "MAX_PENDING", 1)
    app = Recorder()
    app.gate.clear()
    snd.send_soon(app, rt, _batch("first"))  # taken by the thread, blocked in the publish
    assert not snd.flush_sends(0.2)
    snd.send_soon(app, rt, _batch("queued"))
    with caplog.at_level(logging.WARNING, logger="celery_ha.integration.dispatch.sender"):
        snd.send_soon(app, rt, _batch("dropped"))
    assert "sender queue full" in caplog.text
    app.gate.set()
    assert snd.flush_sends(10)
    assert app.sent == [["first"], ["queued"]]


def test_a_completion_refills_the_window_in_its_script_and_sends_off_the_task(rt: Services,
                                                                               r: Any) -> None:
    """The runner's completion dispatches up to the window in the same script and the messages go
    out from the sender thread: the window holds, every queued task is sent exactly once."""
    q = rt.queue
    app = Recorder()
    task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="snd@host"))
    spec = DurableTask(name="fetch_page", fn=lambda ctx: ctx.emit({"u": ctx.url}, key=ctx.url))
    ids = q.enqueue_many([f"http://example.test/{i}" for i in range(8)])
    first = [d.task_id for d in q.dispatch(3)]
    assert first == ids[:3]
    done: list[str] = []
    for tid in first:
        assert run_message(spec, task, tid).kind == "completed"
        done.append(tid)
    assert snd.flush_sends(10)
    assert [m[0] for m in app.sent] == ids[3:6]  # one freed place per claim, refilled at completion
    assert q.stats()["dispatched"] == 3
    check_invariants(r, q)
    # Light tasks: the sender thread publishes (or the next task's thread, before its code runs, what
    # the sender had not started yet).
    assert "celery-ha-sender" in app.threads
    while app.sent:
        tid = app.sent.pop(0)[0]
        assert run_message(spec, task, tid).kind == "completed"
        assert snd.flush_sends(10)
    s = q.stats()
    assert (s["completed"], s["dispatched"], s["queued"], s["items"]) == (8, 0, 0, 8)


def test_without_refill_the_completion_dispatches_nothing(rt: Services) -> None:
    """A batch's ids before its last complete without a refill (the last one refills)."""
    q = rt.queue
    app = Recorder()
    task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="snd@host"))
    spec = DurableTask(name="fetch_page", fn=lambda ctx: None)
    ids = q.enqueue_many([f"http://example.test/{i}" for i in range(4)])
    q.dispatch(1)
    assert run_message(spec, task, ids[0], refill=False).kind == "completed"
    assert snd.flush_sends(10) and app.sent == []
    assert q.stats()["dispatched"] == 0


def test_context_complete_marks_a_stale_lease_lost(rt: Services) -> None:
    q = rt.queue
    tid = q.enqueue("http://example.test/a")
    lease = q.claim_next("w", ttl=0.05)
    ctx = DurableContext(lease, rt, DurableTask(name="fetch_page", fn=lambda c: None))
    ctx.emit({"v": 1}, key="k")
    time.sleep(0.1)
    assert q.reclaim_expired() == 1
    with pytest.raises(LeaseLost):
        ctx._complete(3, 60.0)
    assert ctx.lost and q.get(tid).state == "queued" and q.stats()["dispatched"] == 0


def _burn(seconds: float) -> None:
    """Keep this thread on the CPU for ``seconds`` of its own CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_cpu_busy_task_publishes_its_refill_itself(rt: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks that keep the CPU busy publish their refill from their own thread before returning (no
    sender thread fighting them for the GIL); light tasks after them go back to the sender thread."""
    monkeypatch.setattr(snd, "INLINE_CPU", 0.002)
    q = rt.queue
    app = Recorder()
    task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="snd@host"))
    busy = DurableTask(name="fetch_page", fn=lambda ctx: _burn(0.02))
    ids = q.enqueue_many([f"http://example.test/{i}" for i in range(20)])
    q.dispatch(3)
    for n, tid in enumerate(ids[:3], start=1):
        assert run_message(busy, task, tid).kind == "completed"
        # Sent before run_message returned, by this thread: nothing to flush.
        assert [m[0] for m in app.sent] == ids[3:3 + n]
    assert app.threads == {threading.current_thread().name}
    light = DurableTask(name="fetch_page", fn=lambda ctx: None)
    for tid in ids[3:15]:  # the average decays below the threshold: the sender thread takes over
        assert run_message(light, task, tid).kind == "completed"
        assert snd.flush_sends(10)
    assert app.sent_by[-1] == "celery-ha-sender"  # each light refill was flushed by the thread
    assert [m[0] for m in app.sent] == ids[3:18]  # every refill sent once, in order
    s = q.stats()
    assert (s["completed"], s["dispatched"], s["queued"]) == (15, 3, 2)


def test_a_refill_still_queued_goes_out_before_the_next_tasks_code(rt: Services) -> None:
    """A refill the sender thread has not started is published by the next task's thread before that
    task's code runs: no publish starts beside a task's code."""
    q = rt.queue
    app = Recorder()
    task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="snd@host"))
    seen: list[list[list[str]]] = []
    spec = DurableTask(name="fetch_page", fn=lambda ctx: seen.append(list(app.sent)))
    tid = q.enqueue("http://example.test/next")
    q.dispatch(1)
    assert snd._sender.get().submit(app, rt, _batch("queued-earlier"), wake=False)
    assert run_message(spec, task, tid, refill=False).kind == "completed"
    assert seen == [[["queued-earlier"]]]
    assert app.sent_by == [threading.current_thread().name]


def test_a_gated_completion_arms_the_host_timer_with_no_round_trip_of_its_own(redis_url: str) -> None:
    """With the host gate on, a worker arms its pump timer after every task for the first waiting
    host: the completion's script reads that host's due time, so a task costs its claim and its
    completion, no third round trip, and the timer is armed for the paced host."""
    # The window's cached reads (pause, gate) last a heartbeat interval: long, so none falls in the count.
    settings = Settings(redis_url=redis_url, namespace="gsnd", lease_ttl=120, heartbeat_interval=60, window=3)
    client = redis_client(redis_url, connection_class=CountingConnection)
    q = TaskQueue(client, "gsnd", lease_ttl=5, host_gate=True)
    svc._services.set(Services(settings=settings, redis_url=redis_url, client=client, queue=q))
    svc.set_node("gsnd@host")
    try:
        app = Recorder()
        task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="gsnd@host"))
        spec = DurableTask(name="fetch_page", fn=lambda ctx: None)
        q.hosts.set("a.example", delay=30)
        ids = q.enqueue_many(["http://b.example/0", "http://a.example/1", "http://a.example/2",
                              "http://b.example/1"])
        q.dispatch(3)
        assert run_message(spec, task, ids[0]).kind == "completed"  # warm: scripts, window, services
        assert snd.flush_sends(10)
        main = threading.current_thread().name
        before = CountingConnection.by_thread[main]
        assert run_message(spec, task, ids[1]).kind == "completed"  # a.example: paced 30 s from now
        assert CountingConnection.by_thread[main] - before == 2  # the claim, the completion
        timer = pump.host_timer(q.namespace)
        assert timer.timer is not None and 25 < timer.due - time.monotonic() <= 30
        assert snd.flush_sends(10)
    finally:
        armed = pump.host_timer(q.namespace).timer
        if armed is not None:
            armed.cancel()
        lease_keeper.stop_keeper()
        lease_keeper._keeper.reset()
        svc.reset_services()
