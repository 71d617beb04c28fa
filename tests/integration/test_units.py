"""In-process tests of the Celery integration pieces: context, runner, keeper, pump, sink, registry,
maintenance lock, fetch classification, the demo site and start-up configuration errors."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from celery_ha import LeaseLost
from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.demo import DemoSite
from celery_ha.demo.proxy_farm import ProxyFarm
from celery_ha.fetch import process_fetcher as pf
from celery_ha.fetch.errors import FetchError, PermanentFetchError
from celery_ha.integration.core import services as svc
from celery_ha.integration.core.services import Services as Runtime
from celery_ha.integration.core.task_errors import is_permanent
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.dispatch.broker import broker_lists
from celery_ha.integration.dispatch.pump import celery_priority
from celery_ha.integration.dispatch.sender import flush_sends
from celery_ha.integration.running import lease_keeper as lk
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.running.runner import run_message
from celery_ha.integration.upkeep.maintenance import dead_letter_summary, proxy_health, sweep
from celery_ha.integration.worker import hooks as hooks_module
from celery_ha.integration.worker.hooks import WorkerHooks
from celery_ha.proxy import ProxyPool
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.lock import short_lock
from celery_ha.state import TaskQueue
from celery_ha.state.namespaces import forget
from celery_ha.state.sink import count_items, iter_items
from celery_ha.state.worker_registry import heartbeat, list_workers
from tests.support.fake_queues import fake_amqp

ROOT = Path(__file__).resolve().parents[2]


class FakeApp:
    """Records send_task calls; enough of a Celery app for the pump."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], dict[str, Any]]] = []
        self.conf = SimpleNamespace(broker_url="memory://", task_default_queue="crawl",
                                    broker_transport_options={})
        self.finalized = False
        self.tasks: dict[str, Any] = {}
        self.amqp = fake_amqp()

    @contextlib.contextmanager
    def producer_or_acquire(self) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(channel=None)

    def send_task(self, name: str, args: list[Any], **options: Any) -> None:
        self.sent.append((name, args, options))


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    settings = Settings(redis_url=redis_url, namespace="unit", lease_ttl=5, heartbeat_interval=1,
                        window=4)
    client = redis_client(redis_url)
    q = TaskQueue(client, "unit", lease_ttl=5, max_stalls=3)
    runtime = Runtime(settings=settings, redis_url=redis_url, client=client, queue=q)
    svc._services.set(runtime)
    svc.set_node("unit@host")
    pf._choice.reset()
    yield runtime
    lk.stop_keeper()  # and the watchdog the runner started beside it
    lk._keeper.reset()
    svc.reset_services()
    pf._choice.reset()


def fetch(url: str) -> Any:
    """``ctx.fetch`` without a task: this process's fetcher, as the running services build it."""
    rt = svc.services()
    return pf.process_fetcher(rt.client, rt.settings, rt.worker_name).fetch(url)


@pytest.fixture
def site() -> Iterator[DemoSite]:
    s = DemoSite(total=45, page_size=10).start()
    yield s
    s.stop()


def _spec(fn: Any, **kw: Any) -> DurableTask:
    return DurableTask(name="unit_task", fn=fn, **kw)


# ---------------------------------------------------------------------- context and fencing
def test_stale_context_cannot_emit_checkpoint_or_complete(rt: Runtime) -> None:
    q = rt.queue
    tid = q.enqueue("http://example.test/a", task="unit_task")
    old = q.claim(tid, "unit@host:1")
    assert old is not None
    ctx = DurableContext(old, rt, _spec(lambda c: None))
    ctx.emit({"n": 1}, key="k1")
    assert q.release(tid, token=old.token, count_stall=True) == "queued"
    new = q.claim(tid, "unit@host:2")
    assert new is not None and new.token == old.token + 1
    with pytest.raises(LeaseLost):
        ctx.save_checkpoint({"i": 1})
    assert ctx.lost
    with pytest.raises(LeaseLost):
        ctx.emit({"n": 2})
    with pytest.raises(LeaseLost):
        q.complete(old)
    assert count_items(rt.client, "unit") == 0 and q.checkpoint(tid) is None


def _kept_task(rt: Runtime, url: str) -> tuple[str, DurableContext, lk.LeaseKeeper]:
    """A claimed task, its context, and a keeper (not started) that tracks it."""
    tid = rt.queue.enqueue(url, task="unit_task")
    ctx = DurableContext(rt.queue.claim(tid, rt.worker_name), rt, _spec(lambda c: None))
    keeper = lk.LeaseKeeper(rt)
    keeper.track(ctx)
    return tid, ctx, keeper


def test_keeper_marks_lost_lease_and_stops_writes(rt: Runtime) -> None:
    q = rt.queue
    tid, ctx, keeper = _kept_task(rt, "http://example.test/b")
    lease = ctx.lease
    keeper.renew_all()
    assert not ctx.lost and keeper.held() == [ctx]
    q.release(tid, token=lease.token)
    keeper.renew_all()
    assert ctx.lost and keeper.held() == []
    with pytest.raises(LeaseLost):
        ctx.emit({"x": 1})


def test_keeper_is_silent_about_a_task_that_finished_during_its_renewal(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The keeper renews from a snapshot of its leases; a task that completes (and is untracked by its
    own thread) between that snapshot and the renewal lost nothing: no warning, not marked lost."""
    q = rt.queue
    tid, ctx, keeper = _kept_task(rt, "http://example.test/done")
    renew = q.renew

    def task_finishes_first(held: Any) -> Any:
        q.complete(held)  # the task's thread completes and untracks while the keeper is mid-loop
        keeper.untrack(ctx)
        return renew(held)

    monkeypatch.setattr(q, "renew", task_finishes_first)
    with caplog.at_level(logging.WARNING, logger="celery_ha.integration.running.lease_keeper"):
        keeper.renew_all()
    assert q.get(tid).state == "completed" and not ctx.lost and keeper.held() == []
    assert "lost" not in caplog.text


def test_emit_buffers_until_checkpoint_then_commits_together(rt: Runtime) -> None:
    q = rt.queue
    tid = q.enqueue("http://example.test/c", task="unit_task")
    lease = q.claim(tid, rt.worker_name)
    ctx = DurableContext(lease, rt, _spec(lambda c: None, item_key="id"))
    assert ctx.emit({"id": "a", "v": 1}) == "a"
    ctx.emit({"id": "b"})
    child = ctx.enqueue("http://example.test/child")
    assert count_items(rt.client, "unit") == 0 and q.stats()["enqueued"] == 1
    ctx.save_checkpoint({"i": 2})
    assert count_items(rt.client, "unit") == 2 and q.checkpoint(tid) == {"i": 2}
    assert q.get(child).state == "queued"
    ctx.emit({"id": "a", "v": 999})  # same key: ignored
    ctx.flush()
    assert [i["v"] for i in iter_items(rt.client, "unit") if i["id"] == "a"] == [1]
    assert ctx.checkpoint == {"i": 2} and ctx.attempt == 1


def test_runner_outcomes(rt: Runtime) -> None:
    app = FakeApp()
    task = SimpleNamespace(app=app, request=SimpleNamespace(hostname="unit@host"))
    q = rt.queue

    def ok(ctx: DurableContext) -> None:
        ctx.emit({"url": ctx.url}, key=ctx.url)

    def gone(ctx: DurableContext) -> None:
        raise PermanentFetchError("HTTP 404")

    def flaky(ctx: DurableContext) -> None:
        raise FetchError("HTTP 503")

    t1 = q.enqueue("http://example.test/ok", task="unit_task")
    t2 = q.enqueue("http://example.test/gone", task="unit_task")
    t3 = q.enqueue("http://example.test/flaky", task="unit_task")
    t4 = q.enqueue("http://example.test/next", task="unit_task")
    assert run_message(_spec(ok), task, t1).kind == "completed"
    assert run_message(_spec(ok), task, t1).kind == "dropped"  # duplicate message after completion
    dead = run_message(_spec(gone), task, t2)
    assert (dead.kind, dead.url, dead.detail) == ("failed:dead", "http://example.test/gone",
                                                  "PermanentFetchError: HTTP 404")
    assert q.get(t2).attempts == 1
    retry = run_message(_spec(flaky), task, t3)
    assert retry.kind == "failed:retry" and retry.due_at == q.get(t3).due_at
    assert q.get(t3).state == "delayed"
    assert count_items(rt.client, "unit") == 1
    # the first finished task pumped: the queued ones were sent once each, carrying only their id
    assert flush_sends(10)
    assert sorted(args[0] for _, args, _ in app.sent) == sorted([t2, t3, t4])
    assert all(len(args) == 1 and opts["task_id"].startswith(args[0] + ".") for _, args, opts in app.sent)


def test_is_permanent_unifies_by_flag() -> None:
    class Gone(Exception):
        permanent = True

    assert is_permanent(Gone()) and is_permanent(PermanentFetchError("x"))
    assert not is_permanent(FetchError("x")) and not is_permanent(ValueError())


# ---------------------------------------------------------------------- pump, registry, maintenance
def test_priority_mapping_is_monotonic() -> None:
    values = [celery_priority(p) for p in range(-1000, 1001, 1)]
    assert values == sorted(values, reverse=True)
    assert celery_priority(0) == 3 and celery_priority(1000) == 0 and celery_priority(-1000) == 9
    assert broker_lists("crawl")[0] == "crawl" and len(broker_lists("crawl")) == 4


def test_list_workers_shows_alive_processes_and_their_tasks(rt: Runtime) -> None:
    heartbeat(rt.client, "unit", "n1@h:10")
    heartbeat(rt.client, "unit", "n1@h:11")
    rt.client.zadd(rt.queue.keys.workers, {"old@h:1": 1})  # beat long ago
    tid = rt.queue.enqueue("http://example.test/w", task="unit_task")
    rt.queue.claim(tid, "n1@h:11")
    workers = list_workers(rt.client, "unit", max_age=10)
    assert [(w["name"], w["pid"], w["tasks"]) for w in workers] == [("n1@h:10", 10, []),
                                                                     ("n1@h:11", 11, [tid])]
    assert all(w["node"] == "n1@h" and w["age"] < 10 for w in workers)


def test_maintenance_lock_makes_concurrent_sweeps_harmless(rt: Runtime) -> None:
    app = FakeApp()
    key = rt.queue.keys.lock("sweep")
    with short_lock(rt.client, key, ttl=5) as got:
        assert got
        with short_lock(rt.client, key, ttl=5) as again:
            assert not again
        assert sweep(app, rt) is None  # another "beat" holds the lock
    rt.queue.enqueue("http://example.test/s", task="unit_task")
    result = sweep(app, rt)
    assert result == {"reclaimed": 0, "sent": 1, "source": "beat", "broker_lost": False, "forgotten": 0,
                      "refetched": 0}
    assert rt.client.hget(rt.queue.keys.meta, "last_sweep")
    assert not rt.client.exists(key)


def test_beat_messages_carry_no_expiry_and_a_stale_beat_sweep_skips_itself(rt: Runtime) -> None:
    """No Celery `expires` (it would depend on beat's and the worker's clocks): a beat sweep that
    arrives right after another one (Redis clock) skips; the watchdog's and the first one run."""
    code = ("import celery_ha, json; "
            "print(json.dumps([e['options'] for e in celery_ha.app.conf.beat_schedule.values()]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=_celery_env())
    assert out.returncode == 0, out.stderr
    assert all("expires" not in options for options in json.loads(out.stdout))
    app = FakeApp()
    assert sweep(app, rt, source="beat")["source"] == "beat" and "skipped" not in sweep(app, rt, "watchdog")
    assert "skipped" in sweep(app, rt, source="beat")


def test_a_worker_of_several_namespaces_consumes_and_schedules_each() -> None:
    """CELERY_HA_NAMESPACES: the crawl and maintenance queues of each namespace, and each one's
    maintenance jobs scheduled on its own maintenance queue (the job tells its namespace by it)."""
    code = ("import celery_ha, json; c = celery_ha.app.conf; "
            "print(json.dumps([sorted(q.name for q in c.task_queues), c.task_default_queue, "
            "{k: e['options']['queue'] for k, e in c.beat_schedule.items()}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=_celery_env(CELERY_HA_NAMESPACES="shop,news", CELERY_BROKER_URL="redis://127.0.0.1:2/3"))
    assert out.returncode == 0, out.stderr
    queues, default, beat = json.loads(out.stdout)
    assert queues == ["news.crawl", "news.maintenance", "shop.crawl", "shop.maintenance"]
    assert default == "shop.crawl"
    assert beat == {"celery-ha-sweep": "shop.maintenance", "celery-ha-dead-letters": "shop.maintenance",
                    "celery-ha-proxy-health": "shop.maintenance", "celery-ha-sweep@news": "news.maintenance",
                    "celery-ha-dead-letters@news": "news.maintenance",
                    "celery-ha-proxy-health@news": "news.maintenance"}
    code = ("import celery_ha, json; c = celery_ha.app.conf; "
            "print(json.dumps([sorted(q.name for q in c.task_queues), "
            "{k: [e['task'], e.get('args'), e['options']['queue']] for k, e in c.beat_schedule.items()}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=_celery_env(CELERY_HA_NAMESPACES="shop,crawl-*",
                                         CELERY_BROKER_URL="redis://127.0.0.1:2/3"))
    assert out.returncode == 0, out.stderr
    queues, beat = json.loads(out.stdout)
    assert queues == ["shop.crawl", "shop.maintenance"]  # a pattern's matches are added while it runs
    assert beat["celery-ha-sweep@crawl-*"] == ["celery_ha.maintenance.fan_out", ["sweep"], "shop.maintenance"]
    assert beat["celery-ha-dead-letters@crawl-*"][1] == ["dead_letters"]
    assert beat["celery-ha-proxy-health@crawl-*"][1] == ["proxy_health"]


def test_services_of_each_served_namespace_share_one_client(rt: Runtime) -> None:
    """One Redis client, one task queue per namespace; a message's routing key picks its namespace
    (the longest served prefix: a namespace may hold '.'); a namespace not served is refused."""
    svc.reset_services()
    settings = dataclasses.replace(rt.settings, namespaces=("unit", "unit.b", "news"))
    svc._services.set(dataclasses.replace(rt, settings=settings))
    news = svc.services("news")
    assert news.client is svc.services().client and news.queue.namespace == "news"
    assert news.settings.namespace == "news" and news.settings.lease_ttl == settings.lease_ttl
    assert svc.services("news") is news
    assert [s.settings.namespace for s in svc.served()] == ["unit", "unit.b", "news"]
    assert svc.namespace_of_queue("unit.b.crawl") == "unit.b"
    assert svc.namespace_of_queue("unit.maintenance") == "unit"
    assert svc.namespace_of_queue("blog.crawl") is None and svc.namespace_of_queue(None) is None
    assert svc.namespace_of_request(SimpleNamespace(delivery_info={"routing_key": "news.crawl"})) == "news"
    with svc.serving("news") as current:
        assert current is news and svc.services() is news
        with svc.serving(None):
            assert svc.services().settings.namespace == "unit"
        assert svc.services() is news
    assert svc.services().settings.namespace == "unit"
    with pytest.raises(ConfigurationError, match="not served"):
        svc.services("blog")


def test_a_pattern_serves_the_registered_namespaces_it_matches(rt: Runtime) -> None:
    """CELERY_HA_NAMESPACES=unit,crawl-*: a message of a matching namespace is served at once (its
    routing key), ``served()`` adds the registered matches (read at most every discovery interval,
    sticky), a namespace the pattern does not match is refused."""
    svc.reset_services()
    settings = dataclasses.replace(rt.settings, namespaces=("unit", "crawl-*", "unit.?"),
                                   discovery_interval=3600.0)
    svc._services.set(dataclasses.replace(rt, settings=settings))
    assert svc.namespace_of_queue("crawl-a.crawl") == "crawl-a"
    assert svc.namespace_of_queue("unit.b.crawl") == "unit.b"  # a match longer than a name listed
    assert svc.namespace_of_queue("unit.crawl") == "unit"
    assert svc.namespace_of_queue("crawl-a.b.maintenance") == "crawl-a.b"  # the longest matching prefix
    assert svc.namespace_of_queue("blog.crawl") is None
    assert svc.services("crawl-z").queue.namespace == "crawl-z"
    with pytest.raises(ConfigurationError, match="not served"):
        svc.services("blog")
    client = svc.services().client
    assert [s.settings.namespace for s in svc.served()] == ["unit"]  # the first look: nothing matches
    TaskQueue(client, "crawl-b").enqueue("https://b.test/")
    TaskQueue(client, "blog").enqueue("https://blog.test/")
    assert [s.settings.namespace for s in svc.served()] == ["unit"]  # within the interval
    svc._found.reset()  # as in a freshly forked pool child
    assert [s.settings.namespace for s in svc.served()] == ["unit", "crawl-b"]
    TaskQueue(client, "crawl-c").enqueue("https://c.test/")
    assert svc.discovered() == ["crawl-b"]  # within the interval: the last answer
    assert svc.discovered(refresh=True) == ["crawl-b", "crawl-c"]
    forget(client, "crawl-b")
    assert svc.discovered(refresh=True) == ["crawl-b", "crawl-c"]  # still served until the worker stops
    # A match written with another shard count is not served (each of its claims would be refused).
    TaskQueue(client, "crawl-s", shards=4).enqueue("https://s.test/")
    TaskQueue(client, "crawl-t").enqueue("https://t.test/")
    assert svc.discovered(refresh=True) == ["crawl-b", "crawl-c", "crawl-t"]


def test_fast_failover_visits_only_the_namespace_of_the_failed_message(rt: Runtime, monkeypatch) -> None:
    """A worker of several namespaces remembers each message's namespace when it receives it, so a
    dead child's failover reads that namespace only; a message it does not remember: every one."""
    svc.reset_services()
    settings = dataclasses.replace(rt.settings, namespaces=("unit", "news", "crawl-*"))
    svc._services.set(dataclasses.replace(rt, settings=settings))
    hooks = WorkerHooks(SimpleNamespace())
    visited: list[str] = []
    monkeypatch.setattr(hooks_module, "on_child_lost",
                        lambda rt, app, sender, exception, args: visited.append(rt.settings.namespace))
    hooks.task_received(request=SimpleNamespace(id="m1", delivery_info={"routing_key": "crawl-a.crawl"}))
    hooks.task_received(request=SimpleNamespace(id="m2", delivery_info={"routing_key": "news.maintenance"}))
    hooks.task_failure(args=["t1"], task_id="m1")
    hooks.task_failure(args=["t2"], task_id="m2")
    assert visited == ["crawl-a", "news"]
    visited.clear()
    hooks.task_failure(args=["t1"], task_id="m1")  # forgotten once used
    assert visited == ["unit", "news"]
    for n in range(hooks_module.MESSAGE_MEMORY + 5):  # bounded: the oldest go first
        hooks.task_received(request=SimpleNamespace(id=f"x{n}", delivery_info={"routing_key": "news.crawl"}))
    assert len(hooks.message_namespaces) == hooks_module.MESSAGE_MEMORY
    assert "x0" not in hooks.message_namespaces


def test_proxy_health_hook_is_skipped_without_url_or_proxies(rt: Runtime) -> None:
    assert proxy_health(rt) == {"skipped": "CELERY_HA_PROXY_CHECK_URL not set"}
    with_url = dataclasses.replace(rt, settings=dataclasses.replace(rt.settings,
                                                                   proxy_check_url="http://127.0.0.1:1/"))
    assert proxy_health(with_url) == {"skipped": "no proxies configured"}
    assert dead_letter_summary(rt) == {"dead": 0, "examples": []}


# ---------------------------------------------------------------------- fetch and parsing
def test_fetch_is_direct_without_proxies_and_classifies(rt: Runtime, site: DemoSite) -> None:
    site.fail("/case/1", 404)
    site.fail("/case/2", 410)
    site.fail("/case/3", 503, times=1)
    site.fail("/case/4", "captcha")
    with pytest.raises(PermanentFetchError):
        fetch(site.case_url(1))
    with pytest.raises(PermanentFetchError):
        fetch(site.case_url(2))
    assert fetch(site.case_url(3)).status_code == 200  # one 503, then a retry inside the fetcher
    with pytest.raises(FetchError) as blocked:
        fetch(site.case_url(4))
    assert not is_permanent(blocked.value) and blocked.value.outcome == "blocked"
    assert {r.client_ip for r in site.requests} == {"127.0.0.1"}  # no proxy configured: direct


def test_fetch_goes_through_the_pool_once_it_has_proxies(rt: Runtime, site: DemoSite) -> None:
    farm = ProxyFarm(3, first=31).start()
    try:
        ProxyPool(rt.client, rt.settings.namespace).add_many(farm.urls, source="test")
        for n in range(1, 7):
            assert fetch(site.case_url(n)).status_code == 200
        ips = {r.client_ip for r in site.requests if r.path.startswith("/case/")}
        assert ips and ips <= {"127.0.0.31", "127.0.0.32", "127.0.0.33"}  # never direct
    finally:
        farm.stop()


# ---------------------------------------------------------------------- the demo site
def test_demo_site_pages_failures_rate_limit_and_log() -> None:
    with DemoSite(total=25, page_size=10, rate_limit=(2, 60.0)) as s:
        sess = requests.Session()
        first = sess.get(f"{s.url}/cases?page=1", timeout=5).json()
        assert [i["id"] for i in first["items"]][:2] == ["case-000000", "case-000001"]
        assert first["next"] == 2 and first["total"] == 25
        last = sess.get(f"{s.url}/cases?page=3", timeout=5).json()
        assert len(last["items"]) == 5 and last["next"] is None
        limited = sess.get(f"{s.url}/cases?page=4", timeout=5)
        assert limited.status_code == 429 and limited.headers["Retry-After"]
        log = s.requests
        assert [r.status for r in log] == [200, 200, 429]
        assert all(r.client_ip == "127.0.0.1" and r.time > 0 for r in log)
        assert s.hits(prefix="/cases?page=3")[0].path == "/cases?page=3"
    with DemoSite(total=5) as s:
        assert requests.get(s.case_url(99), timeout=5).status_code == 404
        assert requests.get(f"{s.url}/cases?page=2", timeout=5).json() == {
            "page": 2, "items": [], "next": None, "total": 5}


# ---------------------------------------------------------------------- configuration
def _celery_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_HA_", "CELERY_BROKER"))}
    env.update({"CELERY_HA_REDIS_URL": "redis://127.0.0.1:1/0", "PYTHONPATH": str(ROOT)}, **extra)
    return env


@pytest.mark.parametrize(("var", "value", "needle"), [
    ("CELERY_HA_LEASE_TTL", "soon", "CELERY_HA_LEASE_TTL"),
    ("CELERY_HA_TASK_TIME_LIMIT", "7200", "CELERY_HA_VISIBILITY_TIMEOUT"),
    ("CELERY_HA_HEARTBEAT_INTERVAL", "60", "CELERY_HA_HEARTBEAT_INTERVAL"),
])
def test_bad_settings_stop_the_worker_with_one_line(var: str, value: str, needle: str) -> None:
    celery = str(Path(sys.executable).parent / "celery")
    proc = subprocess.run([celery, "-A", "celery_ha", "worker"], cwd=ROOT, env=_celery_env(**{var: value}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("celery-ha: configuration error")


def test_celeryconfig_is_json_only_and_acks_late() -> None:
    code = ("import celery_ha; c = celery_ha.app.conf; "
            "print(c.task_acks_late, c.worker_prefetch_multiplier, c.accept_content, c.task_serializer, "
            "c.worker_cancel_long_running_tasks_on_connection_loss, c.worker_send_task_events, "
            "c.task_send_sent_event, sorted(q.name for q in c.task_queues), sorted(c.beat_schedule), "
            "c.broker_url, c.broker_transport_options['visibility_timeout'] > c.task_time_limit)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=_celery_env(CELERY_BROKER_URL="redis://127.0.0.1:2/3"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "True 1 ['json'] json True True False ['default.crawl', 'default.maintenance'] "
        "['celery-ha-dead-letters', 'celery-ha-proxy-health', 'celery-ha-sweep'] redis://127.0.0.1:2/3 True")


def test_chains_stop_for_recycling_only_where_celery_recycles_pool_processes() -> None:
    """The bound a chain keeps to (``chain.set_recycle_after``): the CLI's --max-tasks-per-child, else
    the app's setting, for a prefork pool; none for a solo process, which Celery never replaces (its
    chains would stop for good), nor without a bound."""
    from celery.concurrency.prefork import TaskPool as PreforkPool
    from celery.concurrency.solo import TaskPool as SoloPool

    from celery_ha.integration.worker.hooks import recycle_bound

    conf = SimpleNamespace(worker_pool="prefork", worker_max_tasks_per_child=7)
    assert recycle_bound({"pool_cls": PreforkPool, "max_tasks_per_child": 4}, conf) == 4
    assert recycle_bound({"pool_cls": PreforkPool, "max_tasks_per_child": None}, conf) == 7
    assert recycle_bound({}, conf) == 7  # a worker started from code: the app's pool
    assert recycle_bound({"pool_cls": SoloPool, "max_tasks_per_child": 4}, conf) is None
    assert recycle_bound({}, SimpleNamespace(worker_pool="solo", worker_max_tasks_per_child=7)) is None
    assert recycle_bound({"pool_cls": PreforkPool}, SimpleNamespace(worker_pool="prefork",
                                                                     worker_max_tasks_per_child=None)) is None
