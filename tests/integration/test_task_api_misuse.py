"""A durable task used the Celery way, a plain Celery task queued as a durable one, Celery options
that would break the guarantees, and coding errors caught by ctx's own checks: each refused at once,
in one line, never dropped in silence nor retried for nothing (``integration/task_api/misuse.py``)."""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.integration import durable_task
from celery_ha.integration.core import services as svc
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import REGISTRY, DurableTask
from celery_ha.integration.patches import registry
from celery_ha.integration.running import lease_keeper as lk
from celery_ha.integration.running.runner import run_message
from celery_ha.integration.task_api.misuse import DurableTaskCallError, PlainTaskGuard
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from celery_ha.state.enqueue_ops import task_names_unchecked
from celery_ha.state.worker_registry import heartbeat, known_task_names, register_task_names
from tests.integration import misuse_tasks
from tests.support.celery_fixtures import make_cluster, site
from tests.support.celery_helpers import wait_for

__all__ = ["make_cluster", "site"]

PLAIN = "misuse_plain"
IMPORTS = "tests.support.celery_tasks,tests.integration.misuse_tasks"


# ---------------------------------------------------------------------- the Celery way of calling
@pytest.fixture
def app() -> Iterator[Celery]:
    """A Celery app on the in-memory broker: whatever it would publish stays in this process."""
    application = Celery("misuse", broker="memory://", set_as_current=False)
    application.finalize()
    yield application
    application.close()


def test_calling_a_durable_task_the_celery_way_raises_naming_enqueue(app: Celery) -> None:
    """.delay(url) and every other Celery way of calling a durable task raised nothing and queued
    nothing: the worker dropped the URL as a "duplicate" task id at INFO. Each now raises one line
    naming TaskQueue.enqueue and the CLI, as a TypeError and an InvalidInput."""
    task = app.tasks["misuse_emit_list"]
    url = "http://127.0.0.1:1/x"
    ways = {
        "delay": lambda: task.delay(url),
        "apply_async": lambda: task.apply_async([url]),
        "delay with kwargs": lambda: task.delay(url=url),
        "signature": lambda: task.s(url).delay(),
        "chain": lambda: (task.s(url) | task.s()).apply_async(),
        "apply": lambda: task.apply(args=[url]),
        "direct call": lambda: task(url),
        "direct call with kwargs": lambda: task(url=url),
    }
    for way, call in ways.items():
        with pytest.raises(DurableTaskCallError) as raised:
            call()
        assert isinstance(raised.value, TypeError) and isinstance(raised.value, InvalidInput), way
        text = str(raised.value)
        assert "misuse_emit_list" in text and "TaskQueue.from_url" in text and ".enqueue(url" in text, way
        assert "celery-ha enqueue --task misuse_emit_list" in text and "\n" not in text, way


def test_celery_ha_own_sending_still_goes_out(app: Celery) -> None:
    """The pump, the refills and the script push's capture send durable messages with
    app.send_task, which the refusal does not touch."""
    with app.connection_for_write() as conn:
        app.send_task("misuse_emit_list", args=["AbCdEfGh1234"], queue="t.crawl", connection=conn,
                      task_id="AbCdEfGh1234.00ff")
        queue = conn.SimpleQueue("t.crawl")
        message = queue.get(timeout=5)
        assert message.headers["task"] == "misuse_emit_list" and message.payload[0] == ["AbCdEfGh1234"]
        message.ack()
        queue.close()


def _nothing(ctx: Any) -> None:
    pass


def test_the_decorator_refuses_the_options_celery_ha_sets() -> None:
    """@durable_task(acks_late=False, reject_on_worker_lost=True) was accepted (Celery's options won
    over celery-ha's) while the app-level equivalents are refused: refused here too, in one line."""
    for options in ({"acks_late": False}, {"reject_on_worker_lost": True}, {"acks_late": True}):
        with pytest.raises(ConfigurationError) as raised:
            durable_task(name="misuse_refused", **options)(_nothing)
        key, value = next(iter(options.items()))
        assert f"{key}={value!r} refused" in str(raised.value) and "\n" not in str(raised.value)
        assert "misuse_refused" not in REGISTRY
    durable_task(name="misuse_accepted", soft_time_limit=30)(_nothing)  # other options pass
    assert REGISTRY.pop("misuse_accepted").name == "misuse_accepted"


# ---------------------------------------------------------------------- the runner, in process
class _App:
    """Enough of a Celery app for the runner's pump (nothing is sent in these tests)."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(broker_url="memory://", task_default_queue="crawl",
                                    broker_transport_options={})
        self.finalized = False
        self.tasks: dict[str, Any] = {}

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing is sent here")


@pytest.fixture
def rt(redis_url: str) -> Iterator[Services]:
    settings = Settings(redis_url=redis_url, namespace="misuse", lease_ttl=5, heartbeat_interval=1,
                        window=0)
    client = redis_client(redis_url)
    runtime = Services(settings=settings, redis_url=redis_url, client=client,
                       queue=TaskQueue(client, "misuse", lease_ttl=5, max_attempts=3))
    svc._services.set(runtime)
    svc.set_node("misuse@host")
    yield runtime
    lk.stop_keeper()
    lk._keeper.reset()
    svc.reset_services()


def _task() -> Any:
    return SimpleNamespace(app=_App(), request=SimpleNamespace(hostname="misuse@host"))


def _run(rt: Services, fn: Any) -> tuple[Any, Any]:
    """Run ``fn`` as a durable task once; its outcome and its record afterwards."""
    tid = rt.queue.enqueue(f"http://example.test/{uuid.uuid4().hex}", task="misuse_unit")
    outcome = run_message(DurableTask(name="misuse_unit", fn=fn), _task(), tid)
    return outcome, rt.queue.get(tid)


def test_a_url_for_a_task_id_is_dropped_with_a_warning_saying_how_to_enqueue(
        rt: Services, caplog: pytest.LogCaptureFixture) -> None:
    """A message carrying a URL (send_task, a client of a release without the refusal) was logged at
    INFO as a duplicate; it is a WARNING naming the way durable tasks are queued. A duplicate of a
    real id keeps the INFO line."""
    spec = DurableTask(name="misuse_unit", fn=lambda ctx: None)
    with caplog.at_level(logging.INFO, logger="celery_ha.integration.running.runner"):
        for argument in ("http://127.0.0.1:42291/p11.html", "not-an-id"):
            caplog.clear()
            outcome = run_message(spec, _task(), argument)
            assert outcome.kind == "dropped" and "durable tasks are enqueued" in outcome.detail
            [record] = caplog.records
            assert record.levelno == logging.WARNING and argument in record.getMessage()
            assert "this looks like a URL passed to .delay()" in record.getMessage()
            assert "TaskQueue.enqueue(url, task='misuse_unit')" in record.getMessage()
        caplog.clear()
        assert run_message(spec, _task(), "AbCdEfGh1234").kind == "dropped"  # an id, just unknown
        [record] = caplog.records
        assert record.levelno == logging.INFO and "duplicate or stale message" in record.getMessage()


@pytest.mark.parametrize("fn", [
    lambda ctx: ctx.emit(["not", "a", "dict"]),
    lambda ctx: ctx.emit({"at": datetime.datetime(2024, 1, 1)}),
    lambda ctx: ctx.save_checkpoint({"seen": {1, 2}}),
    lambda ctx: ctx.signature({"seen": {1, 2}}),
], ids=["emit-list", "emit-datetime", "checkpoint-set", "signature-set"])
def test_a_value_ctx_cannot_store_ends_the_task_dead_at_once(rt: Services, fn: Any) -> None:
    """A coding error that ctx's own check refuses (InvalidInput) was retried max_attempts times,
    failing the same way each time; it is dead after one attempt, with the message."""
    outcome, info = _run(rt, fn)
    assert outcome.kind == "failed:dead" and info.state == "dead" and info.attempts == 1
    assert info.error.startswith("InvalidInput: ") and outcome.detail == info.error


def _raise_invalid(ctx: Any) -> None:
    raise InvalidInput("the task's own check")


@pytest.mark.parametrize("fn", [_raise_invalid, lambda ctx: ctx.fetch("no url at all")],
                         ids=["task-raises", "fetch-bad-url"])
def test_other_invalid_input_keeps_its_retries(rt: Services, fn: Any) -> None:
    outcome, info = _run(rt, fn)
    assert outcome.kind == "failed:retry" and info.state == "delayed" and info.attempts == 1


# ---------------------------------------------------------------------- enqueue, in process
def test_enqueue_refuses_a_name_the_live_workers_do_not_run_as_durable(rt: Services) -> None:
    """TaskQueue.enqueue accepted any name: a plain Celery task's ran with the durable id as its
    argument every CELERY_HA_REDISPATCH_AFTER. It is refused as the CLI refuses it; with no live
    worker, with allow_unknown_task=True, inside a running task (its children are written at its
    checkpoint) and through enqueue_many_with_status (the CLI's path, which checks itself), accepted."""
    client, q = rt.client, TaskQueue(rt.client, "misuse_names", lease_ttl=5)
    url = "http://example.test/p"
    assert q.enqueue(url, task="proj.tasks.scrape_title")  # no live worker: accepted, as before
    heartbeat(client, "misuse_names", "node@host:1")
    register_task_names(client, "misuse_names", "node@host", ["fetch_page", "scrape_durable"])
    q = TaskQueue(rt.client, "misuse_names", lease_ttl=5)  # a fresh queue: nothing cached
    for call in (lambda: q.enqueue(url, task="proj.tasks.scrape_title"),
                 lambda: q.enqueue_many([url, {"url": url, "task": "proj.tasks.scrape_title"}])):
        with pytest.raises(InvalidInput) as raised:
            call()
        text = str(raised.value)
        assert "'proj.tasks.scrape_title'" in text and "fetch_page, scrape_durable" in text
        assert "allow_unknown_task=True" in text and "\n" not in text
    assert q.enqueue(url, task="scrape_durable") and q.enqueue(url)  # fetch_page, the default
    assert q.enqueue(url + "2", task="proj.tasks.scrape_title", allow_unknown_task=True)
    assert q.enqueue_many_with_status([url + "3"], task="proj.tasks.scrape_title")
    with task_names_unchecked():
        assert q.enqueue(url + "4", task="proj.tasks.scrape_title")
    # A worker that starts with a new name is seen at once: a missing name is read again.
    register_task_names(client, "misuse_names", "node@host", ["fetch_page", "scrape_durable", "newer"])
    assert q.enqueue(url, task="newer")


# ---------------------------------------------------------------------- the guard's patch
def test_the_guard_switches_off_with_one_warning_on_a_consumer_without_strategies(
        caplog: pytest.LogCaptureFixture) -> None:
    """A Celery whose consumer no longer keeps ``strategies`` is left alone, with one WARNING saying
    what is lost; a consumer that has them gets every plain task's strategy wrapped, no other."""
    guard = PlainTaskGuard(SimpleNamespace())
    registry._statuses.pop("strategy_guard", None)
    with caplog.at_level(logging.WARNING, logger="celery_ha.patches"):
        assert not guard.decide(SimpleNamespace())
        assert not guard.decide(SimpleNamespace())
    [warning] = [r.getMessage() for r in caplog.records]
    assert "strategy_guard is off" in warning and "plain Celery task" in warning
    assert {s.name: s.state for s in registry.statuses()}["strategy_guard"] == registry.OFF

    def own(*args: Any) -> None:
        pass

    consumer = SimpleNamespace(strategies={PLAIN: own, "misuse_emit_list": own})
    assert guard.decide(consumer)
    wrapped = consumer.strategies[PLAIN]
    assert wrapped is not own and consumer.strategies["misuse_emit_list"] is own  # a durable task's: not
    assert guard.decide(consumer) and consumer.strategies[PLAIN] is wrapped  # never wrapped twice
    assert {s.name: s.state for s in registry.statuses()}["strategy_guard"] == registry.ON


# ---------------------------------------------------------------------- real workers
def _plain_runs(cluster: Any) -> list[str]:
    key = misuse_tasks.PLAIN_RUNS.format(namespace=cluster.namespace)
    return [v if isinstance(v, str) else v.decode() for v in cluster.r.lrange(key, 0, -1)]


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["", "*=4"])
def test_a_plain_task_name_is_refused_at_enqueue_and_never_run_by_a_worker(make_cluster, site, batch):
    """m_nodecorator: TaskQueue.enqueue(url, task=<a plain Celery task>) ran that task with the
    durable id as its argument, again every CELERY_HA_REDISPATCH_AFTER, the task dispatched for
    ever. Now the enqueue refuses the name; queued anyway (allow_unknown_task), the worker takes the
    pump's message before Celery runs it, and the task ends dead saying why (with batches, every id
    of the message). The team's own message of that task still runs; a coding error in a durable
    task is dead at once; a URL sent as a durable task's message is dropped with a WARNING."""
    cluster = make_cluster(CELERY_HA_EXTRA_IMPORTS=IMPORTS, CELERY_HA_BATCH=batch)
    worker = cluster.worker("w1", concurrency=2)
    wait_for(lambda: "misuse_emit_list" in (known_task_names(cluster.r, cluster.namespace, 30) or ()),
             message="the worker to register its task names")
    urls = [site.case_url(n) for n in range(4)]
    with pytest.raises(InvalidInput, match="run no @durable_task of that name"):
        cluster.q.enqueue(urls[0], task=PLAIN)
    ids = cluster.q.enqueue_many([{"url": u, "task": PLAIN} for u in urls], allow_unknown_task=True)
    coding = cluster.q.enqueue(urls[0], task="misuse_emit_list")
    cluster.pump()

    def states(task_ids: list[str]) -> set[str]:
        return {info.state for info in cluster.q.get_many(task_ids)}

    wait_for(lambda: states([*ids, coding]) == {"dead"}, timeout=40, message="the tasks to end dead")
    for info in cluster.q.get_many(ids):
        assert info.error.startswith(f"'{PLAIN}' is a plain Celery task, not a @durable_task")
    assert cluster.q.get(coding).attempts == 1 and "emit() takes a dict" in cluster.q.get(coding).error
    own = f"own-{uuid.uuid4().hex[:6]}"  # the team's own call of its plain task, on the same queue
    cluster.app.send_task(PLAIN, args=[own], queue=cluster.crawl_queue)
    cluster.app.send_task("misuse_emit_list", args=["http://127.0.0.1:1/p11.html"], queue=cluster.crawl_queue)
    wait_for(lambda: _plain_runs(cluster) == [own], message="the team's own message to run")
    wait_for(lambda: "this looks like a URL passed to .delay()" in cluster.log_text(worker),
             message="the URL's warning")
    log = cluster.log_text(worker)
    assert all(log.count(f"task {tid}: '{PLAIN}' is a plain Celery task") == 1 for tid in ids)
    assert _plain_runs(cluster) == [own]  # never with a durable id
