"""kombu's Redis channel reuses one redis-py client for its synchronous commands (publish, events, acks)
instead of building one per command, and still rebuilds what it must when its pool is dropped.

Real kombu, real Celery, real Redis: what is asserted is what the broker holds, and how many
``redis.Redis`` objects the publishing built (the cost the reuse removes)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import redis
from celery import Celery
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

from celery_ha.integration.patches import kombu_client_reuse, kombu_fixes
from tests.integration.patches.test_kombu_fixes import _ack_on_a_closed_connection


@pytest.fixture
def reuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reuse installed for the test; afterwards kombu is as it was (another test may have built
    the app, which installs it for the whole process)."""
    monkeypatch.setattr(kombu_redis.Channel, "_create_client", kombu_redis.Channel._create_client)
    kombu_client_reuse.install()
    kombu_client_reuse.install()  # idempotent: the app may be built more than once per process


@pytest.fixture
def no_reuse(monkeypatch: pytest.MonkeyPatch) -> None:
    original = kombu_redis.Channel._create_client
    monkeypatch.setattr(kombu_redis.Channel, "_create_client", getattr(original, "__wrapped__", original))


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts ``redis.Redis`` objects built from now on (kombu's channel builds its clients from it)."""
    built: list[int] = []
    original = redis.Redis.__init__

    def counting(self: redis.Redis, *args: object, **kwargs: object) -> None:
        built.append(1)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def _app(url: str) -> Celery:
    app = Celery("reuse", broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"], task_send_sent_event=True,
                    task_default_queue="reuse.q", broker_connection_retry_on_startup=True)
    return app


def _queued_ids(url: str, queue: str) -> list[str]:
    raw = redis.Redis.from_url(url).lrange(queue, 0, -1)
    return [json.loads(m)["headers"]["id"] for m in reversed(raw)]  # LPUSHed: oldest last


def test_publishing_builds_one_client_and_every_message_arrives(
        redis_url: str, reuse: None, clients_built: list[int]) -> None:
    app = _app(redis_url)
    with app.producer_or_acquire() as producer:
        for i in range(100):  # each a message and its task-sent event: two commands
            app.send_task("t", args=[f"T{i}"], task_id=f"T{i}", producer=producer)
    assert _queued_ids(redis_url, "reuse.q") == [f"T{i}" for i in range(100)]
    assert len(clients_built) <= 4  # the connection's channels, not one per command


def test_without_the_reuse_kombu_builds_a_client_per_command(
        redis_url: str, no_reuse: None, clients_built: list[int]) -> None:
    """What the reuse is for (if kombu stops building clients per command, this fails and the
    patch can go)."""
    app = _app(redis_url)
    with app.producer_or_acquire() as producer:
        for i in range(100):
            app.send_task("t", args=[f"T{i}"], task_id=f"T{i}", producer=producer)
    assert len(_queued_ids(redis_url, "reuse.q")) == 100
    assert len(clients_built) >= 200


def test_threads_sending_at_once_lose_and_mix_nothing(redis_url: str, reuse: None) -> None:
    """A pool process publishes from its sender thread while its task runs: each thread's producer
    comes from the app's pool; every message arrives whole, once."""
    app = _app(redis_url)
    errors: list[BaseException] = []

    def send(thread: int) -> None:
        try:
            for i in range(150):
                app.send_task("t", args=[f"{thread}-{i}"], task_id=f"{thread}-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    ids = _queued_ids(redis_url, "reuse.q")
    assert sorted(ids) == sorted(f"{t}-{i}" for t in range(4) for i in range(150))
    for thread in range(4):  # each thread's messages in the order it sent them
        mine = [int(i.split("-")[1]) for i in ids if i.startswith(f"{thread}-")]
        assert mine == sorted(mine)


def test_an_ack_clears_the_unacked_record(redis_url: str, reuse: None) -> None:
    conn = Connection(redis_url)
    queue = Queue("reuse.acks", routing_key="reuse.acks")
    with conn.Producer() as producer:
        for i in range(3):
            producer.publish({"ids": [f"T{i}"]}, routing_key="reuse.acks", declare=[queue],
                             serializer="json")
    messages = [queue(conn.default_channel).get(no_ack=False) for _ in range(3)]
    r = redis.Redis.from_url(redis_url)
    assert r.hlen("unacked") == 3
    for message in messages:
        assert message is not None
        message.ack()
    assert r.hlen("unacked") == 0 and r.llen("reuse.acks") == 0
    conn.release()


def test_a_dropped_pool_is_rebuilt_and_a_closed_connection_still_fails_as_a_connection_error(
        redis_url: str, reuse: None, caplog: pytest.LogCaptureFixture) -> None:
    kombu_fixes.install()
    conn = Connection(redis_url)
    channel = conn.default_channel
    first = channel._create_client()
    assert channel._create_client() is first
    channel._disconnect_pools()  # what kombu does when the connection is lost
    second = channel._create_client()
    assert second is not first and second.connection_pool is channel.pool
    assert second.ping()
    conn.release()
    # And with the closed connection of a consumer that reconnected: the ack is the logged
    # connection error ``kombu_fixes`` makes of it, not a command on a stale client.
    closed, message = _ack_on_a_closed_connection(redis_url, "reuse.closed")
    with caplog.at_level(logging.CRITICAL):
        message.ack_log_error(logging.getLogger("celery.worker"), closed.connection_errors)
    assert "Couldn't ack" in caplog.text and "connection of this channel was closed" in caplog.text
    assert redis.Redis.from_url(redis_url).llen("reuse.closed") == 1
