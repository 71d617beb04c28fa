"""Tracing (OpenTelemetry SDK): one trace per durable task, across the enqueue, a killed attempt, fast
failover, the retry, a child task, a redrive, and the operator's verbs; each task's link entry kept no
longer than its bound, however the task ended; and nothing stored without tracing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (opentelemetry-sdk) is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_ha.base import tracing
from celery_ha.base.settings import Settings
from celery_ha.integration.core import tracing as attempt_tracing
from celery_ha.integration.core.services import Services
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from celery_ha.state.shards import shard_of
from tests.support.celery_fixtures import make_cluster, site  # noqa: F401
from tests.support.celery_helpers import ROOT, wait_for
from tests.support.polling import wait_until
from tests.support.redis_cluster import RedisClusterGroup

# The "view" of these tests: spans of a provider of the test's own, never the process-wide one (that
# would switch tracing on for every later test of the session). ``capture`` reads the current span
# whichever provider made it.
_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_killed_and_retried_task_is_one_trace_with_its_attempts_linked(
        make_cluster: Any, site: Any, tmp_path: Path) -> None:  # noqa: F811
    spans_file = tmp_path / "spans.jsonl"
    cluster = make_cluster(CELERY_HA_EXTRA_IMPORTS="tests.support.celery_tasks,tests.support.otel_export",
                           CELERY_HA_TEST_SPANS=str(spans_file), CELERY_HA_SCRIPT_PUSH="1")
    cluster.worker("w1", concurrency=2)
    tracer = _provider.get_tracer("test")
    with tracer.start_as_current_span("the view") as view:
        tid = cluster.q.enqueue(site.case_url(1), task="test_die_once", meta={"child": site.case_url(2)})
    enqueue_trace = f"{view.get_span_context().trace_id:032x}"
    assert cluster.q.get(tid).trace.startswith(f"00-{enqueue_trace}-")  # stored with the task
    cluster.pump()
    wait_for(lambda: cluster.q.get(tid).state == "completed", 60, 0.1, "the task to complete")

    def attempts() -> list[dict[str, Any]]:
        return [s for s in _spans(spans_file) if s["name"] == "celery_ha.attempt test_die_once"]

    done = wait_for(attempts, 10, 0.1, "the completed attempt's span")[0]
    failover = wait_for(lambda: [s for s in _spans(spans_file) if s["name"] == "celery_ha.failover"],
                        10, 0.1, "the failover span")[0]
    view_id = f"{view.get_span_context().span_id:016x}"
    assert done["trace_id"] == failover["trace_id"] == enqueue_trace  # one trace
    assert done["parent_id"] == view_id and failover["parent_id"] == view_id
    first_attempt = failover["links"][0]  # the killed attempt (its span never ended: SIGKILL)
    assert done["links"] == [first_attempt] and first_attempt != done["span_id"]
    assert done["attributes"]["celery_ha.attempt"] == 2 and done["attributes"]["celery_ha.stalls"] == 1
    assert done["attributes"]["celery_ha.outcome"] == "completed"
    assert done["attributes"]["celery_ha.task_id"] == tid and done["pid"] != failover["pid"]
    child = cluster.q.task_ids([{"url": site.case_url(2), "task": "test_marker"}])[0]
    assert cluster.q.get(child).trace.split("-")[1:3] == [enqueue_trace, done["span_id"]]  # under attempt 2
    assert not cluster.r.exists(attempt_tracing.span_key(cluster.namespace, 1, tid))  # gone once completed

    # the operator's verbs, days later from another process with tracing on, are spans of the same trace
    verbs = tmp_path / "verbs.jsonl"
    code = ("import sys, tests.support.otel_export; from celery_ha.state import TaskQueue; "
            "q = TaskQueue.from_url(sys.argv[1], namespace=sys.argv[2]); q.recrawl([sys.argv[3]]); "
            "q.cancel(sys.argv[3]); q.redrive(sys.argv[3])")
    out = subprocess.run([sys.executable, "-c", code, cluster.state_url, cluster.namespace, tid], cwd=ROOT,
                         env={**os.environ, "CELERY_HA_TEST_SPANS": str(verbs), "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [(s["name"], s["trace_id"], s["parent_id"]) for s in _spans(verbs)] == [
        (f"celery_ha.{verb}", enqueue_trace, view_id) for verb in ("recrawl", "cancel", "redrive")]


def test_without_a_current_span_nothing_is_stored(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="untraced")
    tid = q.enqueue("https://example.com/a")
    assert q.get(tid).trace is None
    assert tracing.capture() is None


def test_a_bad_trace_in_a_spec_is_refused_and_writes_nothing(redis_url: str) -> None:
    from celery_ha.base.errors import InvalidInput

    q = TaskQueue.from_url(redis_url, namespace="badtrace")
    with pytest.raises(InvalidInput, match="traceparent"):
        q.enqueue_many(["https://example.com/ok", {"url": "https://example.com/b", "trace": "nope"}])
    assert q.stats()["queued"] == 0


_SWEEP = """
import sys, time, tests.support.otel_export
from celery_ha.state import TaskQueue
q = TaskQueue.from_url(sys.argv[1], namespace="swept")
lease = q.claim_next("gone-worker:1", ttl=0.2)  # its holder never renews: the lease expires
deadline = time.monotonic() + 20
while q.reclaim_expired() == 0:  # the sweep's reclaim, polled until the Redis clock passed the expiry
    assert time.monotonic() < deadline, "the lease never expired"
    time.sleep(0.05)
q.cancel(sys.argv[3])
assert q.redrive() == 1  # every dead task (the script names them: one span each)
"""


def test_reclaim_after_lease_expiry_and_redrive_of_all_dead_are_spans_of_the_tasks_traces(
        redis_url: str, tmp_path: Path) -> None:
    q = TaskQueue.from_url(redis_url, namespace="swept")
    tracer = _provider.get_tracer("test")
    with tracer.start_as_current_span("enqueue a") as span_a:
        a = q.enqueue("https://example.com/a")
    with tracer.start_as_current_span("enqueue b") as span_b:
        b = q.enqueue("https://example.com/b")
    spans = tmp_path / "sweep.jsonl"
    out = subprocess.run([sys.executable, "-c", _SWEEP, redis_url, a, b], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "CELERY_HA_TEST_SPANS": str(spans), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    trace_of = {f"{s.get_span_context().trace_id:032x}": name for name, s in (("a", span_a), ("b", span_b))}
    got = [(s["name"], trace_of.get(s["trace_id"]), s["attributes"].get("celery_ha.task_id"),
            s["attributes"].get("celery_ha.outcome")) for s in _spans(spans)]
    assert got == [("celery_ha.reclaim", "a", a, "queued"),  # a's lease taken back, in a's trace
                   ("celery_ha.cancel", "b", b, None),
                   ("celery_ha.redrive", "b", b, None)]  # `redrive` of all dead names b
    assert q.get(a).state == "queued" and q.get(b).state == "queued"


def test_a_redriven_dead_task_s_next_attempt_links_to_the_attempt_that_died(
        make_cluster: Any, site: Any, tmp_path: Path) -> None:  # noqa: F811
    spans_file = tmp_path / "spans.jsonl"
    cluster = make_cluster(CELERY_HA_EXTRA_IMPORTS="tests.support.celery_tasks,tests.support.otel_export",
                           CELERY_HA_TEST_SPANS=str(spans_file))
    cluster.worker("w1", concurrency=1)
    with _provider.get_tracer("test").start_as_current_span("the view"):
        tid = cluster.q.enqueue(site.case_url(1), task="test_fetch_then_fail", max_attempts=1)
    cluster.pump()

    def attempts() -> list[dict[str, Any]]:
        return [s for s in _spans(spans_file) if s["name"] == "celery_ha.attempt test_fetch_then_fail"]

    died = wait_until(attempts, 60, 0.1, "the first attempt's span")[0]
    assert died["attributes"]["celery_ha.outcome"] == "failed:dead" and cluster.q.get(tid).state == "dead"
    assert cluster.q.redrive(tid) == 1  # what `celery-ha dead redrive ID` does
    cluster.pump()
    redriven = wait_until(lambda: attempts()[1:], 60, 0.1, "the redriven attempt's span")[0]
    assert redriven["trace_id"] == died["trace_id"] and redriven["span_id"] != died["span_id"]
    assert redriven["links"] == [died["span_id"]]  # linked to the attempt that died, before the redrive


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Tracing on in this process for one test: the provider celery-ha finds is the test's (patched for
    the test, not set: a provider once set stays for the whole session), spans to the in-memory exporter."""
    from opentelemetry import trace

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: _provider)
    _exporter.clear()
    return _exporter


def _services(q: TaskQueue) -> Services:
    return Services(settings=Settings(namespace=q.namespace), redis_url="", client=q.client, queue=q)


def _linked(rt: Services, exporter: InMemorySpanExporter, task_id: str) -> bool:
    """Whether a span of ``task_id`` recorded now links to an attempt of it: its entry is still kept."""
    attempt_tracing.task_event(rt, rt.queue.get(task_id), "celery_ha.probe")
    return bool(exporter.get_finished_spans()[-1].links)


def _one_more_attempt(rt: Services, task_id: str) -> None:
    """An attempt of ``task_id``, handed back at once (the namespace stays busy: it comes back)."""
    lease = rt.queue.claim_next("w1:1", ttl=30)
    assert lease is not None and lease.task_id == task_id
    attempt = attempt_tracing.attempt_started(lease, rt)
    rt.queue.release(task_id, token=lease.token, worker="w1:1", count_stall=False, reason="handed back")
    attempt.ended("released")


def test_the_entry_of_a_task_cancelled_while_running_or_reclaimed_to_dead_goes_within_spans_ttl(
        redis_url: str, traced: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attempt_tracing, "SPANS_TTL", 3)  # the bound (7 days), shortened
    q = TaskQueue.from_url(redis_url, namespace="spanttl")
    rt = _services(q)
    cancelled = q.enqueue("https://example.com/cancelled")
    swept = q.enqueue("https://example.com/swept", max_stalls=0)
    busy = q.enqueue("https://example.com/busy")
    lease = q.claim_next("w1:1", ttl=30)
    assert lease is not None and lease.task_id == cancelled
    attempt = attempt_tracing.attempt_started(lease, rt)
    assert q.cancel(cancelled) == "running"
    attempt.ended("lost", "lease lost: cancelled")  # what its run reports when its next fenced write fails
    lease = q.claim_next("gone-worker:1", ttl=0.2)
    assert lease is not None and lease.task_id == swept
    # its attempt starts in a thread that then vanishes (the worker died): its span never ends
    died = threading.Thread(target=attempt_tracing.attempt_started, args=(lease, rt))
    died.start()
    died.join()
    wait_until(lambda: q.reclaim_expired() or q.get(swept).state == "dead", 10, 0.05, "the sweep's reclaim")
    assert q.get(swept).state == "dead" and q.get(cancelled).state == "dead"
    assert _linked(rt, traced, cancelled) and _linked(rt, traced, swept)  # kept for a redrive, for now

    def both_gone() -> bool:
        _one_more_attempt(rt, busy)  # a busy namespace: attempts of another task go on meanwhile
        return not _linked(rt, traced, cancelled) and not _linked(rt, traced, swept)

    wait_until(both_gone, attempt_tracing.SPANS_TTL + 1, 0.05, "the entries of the tasks that are gone to go")
    assert _linked(rt, traced, busy)  # the busy task's own entry stays: each task has its own clock


def test_a_sharded_namespace_keeps_each_entry_on_its_task_s_shard_in_a_cluster(
        cluster_url: str, redis_cluster: RedisClusterGroup, traced: InMemorySpanExporter) -> None:
    client = redis_client(cluster_url)
    q = TaskQueue(client, "tracedshards", lease_ttl=30, shards=3)
    rt = _services(q)
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(30)])
    for _ in ids:
        lease = q.claim_next("w1:1")
        assert lease is not None
        attempt = attempt_tracing.attempt_started(lease, rt)
        assert q.fail(lease, "boom", retry=False) == "dead"
        attempt.ended("failed:dead")
    assert sorted(info.id for info in q.dead(limit=100)) == sorted(ids)  # each ran once
    # one shard per master (shards.py): each entry is on its task's shard, so the entries, and the writes
    # of tracing, spread with the tasks over the masters
    per_shard = Counter(shard_of(tid, 3) for tid in ids)
    assert sorted(redis_cluster.keys_per_node("cha:*:spans:*")) == sorted(per_shard.values())
    assert all(_linked(rt, traced, tid) for tid in ids)
