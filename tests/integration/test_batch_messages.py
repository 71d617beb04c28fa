"""Batch messages: the pump groups ids per task name and priority, and the broker inspection reads
every id a waiting batch message carries (so a re-send skips all of them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import redis
from celery import Celery

from celery_ha.base.settings import Settings
from celery_ha.integration.dispatch.broker import message_task_ids, waiting_ids
from celery_ha.integration.dispatch.pump import send
from celery_ha.state import Dispatched


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str], dict[str, Any]]] = []
        self.conf = SimpleNamespace(broker_url="memory://", broker_transport_options={})

    @contextlib.contextmanager
    def producer_or_acquire(self) -> Iterator[str]:
        yield "producer"  # one for the whole call

    def send_task(self, name: str, args: list[str], **options: Any) -> None:
        assert options["producer"] == "producer" and options["argsrepr"] == repr(args)
        self.sent.append((name, args, options))


def test_send_groups_by_task_and_priority_up_to_the_batch_size() -> None:
    app = Recorder()
    batch = [Dispatched(f"a{n}", "fetch_page", 0, False) for n in range(5)]
    batch += [Dispatched("h1", "fetch_page", 5, False), Dispatched("c1", "crawl_list", 0, False)]
    settings = Settings.from_env({"CELERY_HA_BATCH": "fetch_page=2"})
    assert send(app, "ns", batch, settings) == 7
    assert [(name, args) for name, args, _ in app.sent] == [
        ("fetch_page", ["a0", "a1"]), ("fetch_page", ["a2", "a3"]), ("fetch_page", ["a4"]),
        ("fetch_page", ["h1"]), ("crawl_list", ["c1"])]
    assert all(opts["task_id"].startswith(args[0] + ".") for _, args, opts in app.sent)
    assert {opts["priority"] for name, args, opts in app.sent if args == ["h1"]} == {0}  # priority 5


def test_waiting_batch_messages_show_every_id(redis_url: str) -> None:
    broker_url = redis_url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(broker_url).flushdb()
    app = Celery("batch_probe", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    app.send_task("fetch_page", args=["id1", "id2", "id3"], queue="ns.crawl", task_id="id1.abcd")
    app.send_task("fetch_page", args=["id4"], queue="ns.crawl", task_id="id4.ef01")
    raw = redis.Redis.from_url(broker_url).lrange("ns.crawl", 0, -1)
    assert sorted(i for message in raw for i in message_task_ids(message)) == ["id1", "id2", "id3", "id4"]
    assert waiting_ids(app, ["ns.crawl"]) == {"id1", "id2", "id3", "id4"}
    assert message_task_ids(b"not json") == [] and message_task_ids(b'{"headers": {"id": "x.1"}}') == ["x"]
    app.close()


def test_resend_dispatched_takes_every_lost_message_past_one_calls_limit(redis_url: str) -> None:
    """After a loss (broker emptied, or a dead worker's reserved messages), every dispatched task is
    sent again, also past the 1,000 a dispatch call re-stamps per shard; a second call finds every
    message waiting and sends none (and ends)."""
    from celery_ha.integration.core.queues import broker_queue
    from celery_ha.integration.dispatch.broker import broker_backlog, broker_lists
    from celery_ha.integration.dispatch.pump import pump, resend_dispatched
    from celery_ha.state import TaskQueue

    broker_url = redis_url.rsplit("/", 1)[0] + "/7"
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    app = Celery("resend_probe", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    settings = Settings.from_env({"CELERY_HA_WINDOW": "3000", "CELERY_HA_NAMESPACE": "rs"})
    q = TaskQueue.from_url(redis_url, "rs")
    ids = q.enqueue_many([f"https://example.com/{n}" for n in range(2500)])
    assert pump(q, app, settings) == 2500
    crawl = broker_queue("rs")
    assert broker_backlog(broker, crawl) == 2500
    broker.delete(*broker_lists(crawl))  # every message lost
    assert resend_dispatched(q, app, settings) == 2500
    waiting = [i for name in broker_lists(crawl) for message in broker.lrange(name, 0, -1)
               for i in message_task_ids(message)]
    assert sorted(waiting) == sorted(ids)
    assert resend_dispatched(q, app, settings) == 0 and broker_backlog(broker, crawl) == 2500
    app.close()
