"""The completion script pushes the refill's Celery messages onto a Redis broker itself.

Real Celery, kombu and Redis: the message the script pushes is compared with the one Celery's own
publish writes for the same task, and a real worker's crawl is watched with MONITOR to see who pushed
each message (a script's commands show as ``lua``)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery._state import _task_stack
from kombu import Connection, Exchange, Queue
from kombu.transport.redis import PRIORITY_STEPS, Channel

from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import broker_queue
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import REGISTRY, DurableTask
from celery_ha.integration.dispatch import script_push as sp
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.integration.dispatch.publisher import HeldProducer, publish_ids
from celery_ha.integration.dispatch.pump import celery_priority
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from celery_ha.state.list_push import message_priority
from tests.support.celery_fixtures import make_cluster, site  # noqa: F401  (fixtures)
from tests.support.celery_helpers import wait_for, watched_lpushes

NS = "spush"
QUEUE = broker_queue(NS)


def _db_url(redis_url: str, db: int) -> str:
    return f"{redis_url.rsplit('/', 1)[0]}/{db}"


def _app(broker_url: str, **conf: Any) -> Celery:
    app = Celery("spush", broker=broker_url)
    app.conf.update({"task_serializer": "json", "accept_content": ["json"], "task_send_sent_event": False,
                     "broker_connection_retry_on_startup": True, **conf})
    return app


def _rt(redis_url: str, **settings: Any) -> Services:
    client = redis_client(redis_url)
    return Services(settings=Settings(redis_url=redis_url, broker_url=settings.pop("broker_url", None),
                                      namespace=NS, **settings),
                    redis_url=redis_url, client=client, queue=TaskQueue(client, NS, lease_ttl=30))


@pytest.fixture
def broker(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(_db_url(redis_url, 9))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _decoded(raw: bytes) -> dict[str, Any]:
    message = json.loads(raw)
    if message["properties"].get("body_encoding") == "base64":
        message["body"] = base64.b64decode(message["body"]).decode()
    message["body"] = json.loads(message["body"])
    return message


def test_the_pushed_message_is_the_one_celery_publishes(redis_url: str, broker: redis.Redis) -> None:
    """Field by field, the script's message is Celery's own for the same task, but for what is unique
    to each message (its id's nonce, the delivery tag) and the body's encoding (JSON text, not base64)."""
    app = _app(_db_url(redis_url, 9))
    rt = _rt(redis_url, broker_url=_db_url(redis_url, 9))
    push = sp.script_push(app, rt)
    assert push is not None and push.db == 9
    q = rt.queue
    first = q.enqueue("https://example.com/first")
    nxt = q.enqueue("https://example.com/next", priority=2, task="detail_page")
    done = q.complete_and_push(q.claim(first, "w"), window=1, push=push)
    assert (done.pushed, done.to_send) == (1, [])
    key = push.keys[message_priority(2)]
    (pushed_raw,) = broker.lrange(key, 0, -1)
    broker.delete(key)
    held = HeldProducer()
    publish_ids(app, "detail_page", [nxt], queue=QUEUE, priority=celery_priority(2), message_id=f"{nxt}.abcd",
                producer=held.get(app))
    held.release()
    (published_raw,) = broker.lrange(key, 0, -1)  # the same list: kombu chose it from the same priority
    pushed, published = _decoded(pushed_raw), _decoded(published_raw)
    message_id = pushed["headers"]["id"]
    assert message_id.startswith(f"{nxt}.") and len(message_id) > len(nxt) + 8
    for message in (pushed, published):
        for field in ("id", "root_id"):
            message["headers"].pop(field)
        for field in ("delivery_tag", "correlation_id", "body_encoding", "reply_to"):  # reply_to: per thread
            message["properties"].pop(field)
    assert pushed == published
    assert pushed["headers"]["task"] == "detail_page" and pushed["body"][0] == [nxt]


def test_kombu_consumes_a_pushed_message_and_restores_it_unacked(redis_url: str, broker: redis.Redis) -> None:
    """kombu's own consumer reads a pushed message (the task id, the body as JSON text), and one left
    unacked goes back to its list whole (``restore`` on close: what a lost worker's messages get)."""
    app = _app(_db_url(redis_url, 9))
    rt = _rt(redis_url, broker_url=_db_url(redis_url, 9))
    push = sp.script_push(app, rt)
    assert push is not None
    q = rt.queue
    first = q.enqueue("https://example.com/first")
    nxt = q.enqueue("https://example.com/next")
    assert q.complete_and_push(q.claim(first, "w"), window=1, push=push).pushed == 1
    with Connection(_db_url(redis_url, 9)) as connection:
        consumer = Queue(QUEUE, routing_key=QUEUE)(connection.channel())
        message = consumer.get(no_ack=False)
        assert message is not None and message.decode()[0] == [nxt]
        assert message.headers["task"] == "fetch_page" and message.headers["id"].startswith(f"{nxt}.")
        assert message.properties["priority"] == message_priority(0)
        tag = message.delivery_tag
    # The connection closed with the message unacked: kombu put it back.
    with Connection(_db_url(redis_url, 9)) as connection:
        again = Queue(QUEUE, routing_key=QUEUE)(connection.channel()).get(no_ack=False)
        assert again is not None and again.delivery_tag == tag and again.decode()[0] == [nxt]
        again.ack()
    assert broker.llen(push.keys[message_priority(0)]) == 0


def test_a_redis_broker_elsewhere_or_of_another_kind_gets_no_push(redis_url: str) -> None:
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].split(":")
    assert sp.broker_db(redis_url, redis_url) == (True, None)
    assert sp.broker_db(_db_url(redis_url, 3), redis_url) == (True, 3)
    assert sp.broker_db(f"redis://{host}:{int(port) + 1}/0", redis_url) == (False, None)
    assert sp.broker_db(f"redis://:secret@{host}:{port}/0", redis_url) == (False, None)  # another user
    assert sp.broker_db("amqp://guest:guest@127.0.0.1:5672//", redis_url) == (False, None)
    assert sp.broker_db("sentinel://127.0.0.1:26379/0", "sentinel://127.0.0.1:26379/0") == (False, None)


def test_under_sentinel_only_the_states_own_master_is_pushed_to() -> None:
    """The state on Sentinel: the push needs the broker that celeryconfig builds from the state's own
    URL (CELERY_BROKER_URL unset) and the same master; any other broker the app names is elsewhere."""
    state = "sentinel://127.0.0.1:26379/0"
    settings = Settings(redis_url=state, sentinel_master="mymaster")
    rt = SimpleNamespace(redis_url=state, settings=settings)
    own = kombu_broker(state, settings)
    app = _app(own.url, broker_transport_options=own.transport_options)
    assert sp._broker_db(app, rt) == (True, None)
    for other in (_app("amqp://guest:guest@127.0.0.1:5672//"), _app("redis://127.0.0.1:6380/0"),
                  _app(own.url, broker_transport_options={**own.transport_options, "master_name": "other"})):
        assert sp._broker_db(other, rt) == (False, None)
    configured = SimpleNamespace(redis_url=state, settings=Settings(redis_url=state, broker_url=state,
                                                                     sentinel_master="mymaster"))
    assert sp._broker_db(app, configured) == (False, None)  # a broker URL of its own: not assumed


def test_a_broker_write_url_elsewhere_gets_no_push(redis_url: str) -> None:
    app = _app(redis_url, broker_write_url="redis://127.0.0.1:6380/0")
    assert sp.script_push(app, _rt(redis_url)) is None


@pytest.mark.parametrize("options", [{}, {"priority_steps": list(range(10)), "sep": ":"},
                                     {"priority_steps": [0, 5], "global_keyprefix": "p/"}])
def test_list_keys_are_kombus_own(options: dict[str, Any]) -> None:
    """The key of each priority is what kombu's channel pushes to (its ``_q_for_pri``; the prefix is
    what its prefixed client adds)."""
    channel = SimpleNamespace(priority_steps=options.get("priority_steps", PRIORITY_STEPS),
                              sep=options.get("sep", Channel.sep))
    channel.priority = lambda n: Channel.priority(channel, n)  # type: ignore[attr-defined]
    prefix = options.get("global_keyprefix", "")
    expected = tuple(prefix + Channel._q_for_pri(channel, "ns.crawl", p) for p in range(10))
    assert sp.list_keys("ns.crawl", options) == expected


@pytest.mark.parametrize("why, setup", [
    ("CELERY_HA_SCRIPT_PUSH=0", {"settings": {"script_push": False}}),
    ("batches", {"settings": {"batch": {"*": 5}}}),
    ("task-sent events", {"conf": {"task_send_sent_event": True}}),
    ("not a Redis", {"settings": {"broker_url": "amqp://guest:guest@127.0.0.1:5672//"},
                     "broker": "amqp://guest:guest@127.0.0.1:5672//"}),
])
def test_what_turns_the_push_off(redis_url: str, why: str, setup: dict[str, Any]) -> None:
    app = _app(setup.get("broker", redis_url), **setup.get("conf", {}))
    rt = _rt(redis_url, **setup.get("settings", {}))
    assert sp.script_push(app, rt) is None
    assert why in sp._plans.get()[NS].why_not


def test_the_start_up_decision_warns_once_when_kombu_cannot_be_captured(
        redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A kombu whose virtual channel no longer reads a message back (what the capture relies on):
    refills go out from Python, and the worker's start-up decision says why in one WARNING."""
    from kombu.transport import memory

    monkeypatch.delattr(memory.Channel, "_get")  # the virtual base's _get raises NotImplementedError
    app, rt = _app(redis_url), _rt(redis_url)
    with caplog.at_level(logging.WARNING, logger=sp.log.name):
        decision = sp.startup_decision(app, rt)
        assert sp.startup_decision(app, rt) == decision  # decided once per process, app and services
    assert decision.startswith("Python publish (no push could be built (NotImplementedError")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "script push is off" in warning and sp.VERIFIED in warning
    assert sp.script_push(app, rt) is None


def test_the_start_up_decision_is_quiet_when_the_configuration_turns_the_push_off(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    app, rt = _app(redis_url), _rt(redis_url, script_push=False)
    with caplog.at_level(logging.WARNING, logger=sp.log.name):
        assert sp.startup_decision(app, rt) == "Python publish (CELERY_HA_SCRIPT_PUSH=0)"
    assert not caplog.records
    assert sp.startup_decision(_app(redis_url), _rt(redis_url)) == "script push"


def test_a_plan_made_inside_a_task_does_not_make_every_message_its_child(redis_url: str) -> None:
    """The first completion of a process builds the plan while its task runs: the captured message
    must not carry that task as parent (Celery reads the current task per thread)."""
    app = _app(redis_url)

    @app.task(name="spush_parent", shared=False)
    def parent() -> None:
        pass

    parent.push_request(id="PARENT.x", root_id="ROOT.x", called_directly=False)
    _task_stack.push(parent)
    try:
        assert app.current_worker_task is parent
        push = sp.script_push(app, _rt(redis_url))
    finally:
        _task_stack.pop()
        parent.pop_request()
    assert push is not None
    text = "".join(push.template)
    assert "PARENT" not in text and "ROOT" not in text
    assert '"parent_id": null' in text


def _published_alike(app: Celery, broker_url: str, names: list[str]) -> bool:
    """Whether this Celery's own ``send_task`` writes the same message for each of ``names``, but for
    what is unique to a message (its id, name, delivery tag): the truth the template must match."""
    broker = redis.Redis.from_url(broker_url)
    seen = []
    for name in names:
        broker.delete(QUEUE)
        app.send_task(name, args=["T1"], task_id="T1", queue=QUEUE)
        message = _decoded(broker.rpop(QUEUE))
        for field in ("id", "task", "root_id"):
            message["headers"].pop(field, None)
        for field in ("delivery_tag", "correlation_id"):
            message["properties"].pop(field, None)
        seen.append(message)
    broker.close()
    return all(message == seen[0] for message in seen)


@pytest.mark.parametrize("options", [{"time_limit": 9}, {"expires": 30}])
def test_a_durable_task_with_publish_options_of_its_own_gets_no_push(redis_url: str, options: dict[str, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One template serves every task: a task publishing otherwise than the others (its own time
    limit), or with a time in its messages (an expiry counts from each publish), turns the push off."""
    app = _app(redis_url)

    @app.task(name="spush_plain", shared=False)
    def plain() -> None:
        pass

    @app.task(name="spush_own", shared=False, **options)
    def own() -> None:
        pass

    app.finalize()  # as a worker's app is: send_task may read the registered task's options
    monkeypatch.setattr(sp, "REGISTRY", {name: DurableTask(name=name, fn=lambda c: None)
                                         for name in ("spush_plain", "spush_own")})
    push = sp.script_push(app, _rt(redis_url))
    if _published_alike(app, redis_url, ["spush_plain", "spush_own"]):
        # Celery 5.6 publishes by name alone (the task's own options are not read): the one
        # template is what this Celery writes for both, so the push stays on.
        assert push is not None
        return
    assert push is None  # Celery 5.7 writes each task's own time limit or expiry
    assert "differ" in sp._plans.get()[NS].why_not
    monkeypatch.setattr(sp, "REGISTRY", {"spush_plain": DurableTask(name="spush_plain", fn=lambda c: None)})
    assert sp.script_push(app, _rt(redis_url)) is not None  # alone, it publishes as the template says


def test_a_crawl_queue_whose_lists_expire_gets_no_push(redis_url: str) -> None:
    app = _app(redis_url, task_queues=[Queue(QUEUE, routing_key=QUEUE, expires=600)])
    assert sp.script_push(app, _rt(redis_url)) is None


def test_a_crawl_queue_routed_through_an_exchange_gets_no_push(redis_url: str) -> None:
    routed = Queue(QUEUE, Exchange("spush.x", type="topic"), routing_key="crawl.#")
    app = _app(redis_url, task_queues=[routed])
    assert sp.script_push(app, _rt(redis_url)) is None
    assert "differ" in sp._plans.get()[NS].why_not


def test_a_durable_task_of_another_queue_turns_the_push_off(redis_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    other = DurableTask(name="spush_other", fn=lambda c: None, queue="slow")
    monkeypatch.setitem(REGISTRY, "spush_other", other)
    assert sp.script_push(_app(redis_url), _rt(redis_url)) is None
    assert "another queue" in sp._plans.get()[NS].why_not


def test_a_publish_signal_receiver_turns_the_push_off_while_connected(redis_url: str) -> None:
    app, rt = _app(redis_url), _rt(redis_url)
    assert sp.script_push(app, rt) is not None

    def trace(**kwargs: Any) -> None:
        pass

    signals.before_task_publish.connect(trace)
    try:
        assert sp.script_push(app, rt) is None
    finally:
        signals.before_task_publish.disconnect(trace)
    assert sp.script_push(app, rt) is not None


def test_a_refused_push_turns_it_off_for_the_process(redis_url: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    app, rt = _app(redis_url), _rt(redis_url)
    assert sp.script_push(app, rt) is not None
    sp.push_refused("OOM command not allowed when used memory > 'maxmemory'.")  # it passes
    assert sp.script_push(app, rt) is not None
    sp.push_refused("NOPERM this user has no permissions to run the 'select' command")
    assert sp.script_push(app, rt) is None
    assert "publishes them from Python" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("script_push", ["1", "0"])
def test_a_real_workers_refills_are_pushed_by_the_completion_script(make_cluster, site, script_push: str  # noqa: F811
                                                                   ) -> None:
    """Through a real worker every refill message is pushed by the completion's script (MONITOR shows
    its LPUSH as a script's), and the crawl completes; with CELERY_HA_SCRIPT_PUSH=0 every message is
    published by a client (kombu)."""
    # No chains: a chained task has no message (tests/chaos/test_chains.py); here every task has one.
    cluster = make_cluster(CELERY_HA_WINDOW="2", CELERY_HA_SCRIPT_PUSH=script_push, CELERY_HA_CHAIN="0")
    cluster.worker("w1", concurrency=2)
    with watched_lpushes(cluster.broker_url) as seen:
        ids = cluster.q.enqueue_many([site.case_url(n) for n in range(12)])
        cluster.pump()  # the first two messages, from this process
        wait_for(lambda: cluster.all_completed(ids), timeout=60, message="12 tasks completed")
    crawl = [c for c in seen if cluster.crawl_queue in c["command"]]
    by_script = [c for c in crawl if c.get("client_type") == "lua"]
    assert len(crawl) >= 12
    if script_push == "1":
        assert len(by_script) == 10, [c["command"][:80] for c in crawl]  # 12 tasks, 2 sent by the pump
    else:
        assert by_script == []
