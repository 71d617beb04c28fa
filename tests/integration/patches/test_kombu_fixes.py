"""A command on a kombu Redis channel whose broker connection is gone: a connection error, which
Celery's "Couldn't ack" handling absorbs, not an AttributeError that ends the worker process.

Real kombu, real Redis. The consumer's sequence on a broker loss is: deliver, collect and close the
connection, reconnect on a new one; a task finishing then acks on the old channel. Whether that
channel still has a connection pool depends on timing (closing it rebuilds one to restore unacked
messages; a failed restore or a fork drops it): the test drops it, so the ack has to rebuild it from
the closed connection's settings, the path that raised AttributeError."""

from __future__ import annotations

import logging

import pytest
import redis
from kombu import Connection, Queue
from kombu.common import ignore_errors
from kombu.message import Message

from celery_ha.integration.patches import kombu_fixes


def _ack_on_a_closed_connection(url: str, queue_name: str) -> tuple[Connection, Message]:
    """A message delivered on a connection the consumer then collected and closed, on a channel that
    lost its pool: the state in which a late ack must rebuild it."""
    conn = Connection(url)
    queue = Queue(queue_name, routing_key=queue_name)
    with conn.Producer() as producer:
        producer.publish({"ids": ["T1"]}, routing_key=queue_name, declare=[queue], serializer="json")
    message = queue(conn.default_channel).get(no_ack=False)
    assert message is not None
    conn.collect(socket_timeout=1)  # what Celery's consumer does on a connection loss
    ignore_errors(conn, conn.close)
    message.channel._disconnect_pools()
    return conn, message


def test_an_ack_on_a_closed_connection_is_a_logged_connection_error(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    kombu_fixes.install()
    kombu_fixes.install()  # idempotent: the app may be built more than once per process
    conn, message = _ack_on_a_closed_connection(redis_url, "kf.q")
    errors = conn.connection_errors
    with caplog.at_level(logging.CRITICAL):
        message.ack_log_error(logging.getLogger("celery.worker"), errors)  # as Celery's Request does
    assert "Couldn't ack" in caplog.text and "connection of this channel was closed" in caplog.text
    # Nothing lost: closing the connection put the message back in its queue (the durable layer drops
    # it as a duplicate when it is delivered again).
    assert redis.Redis.from_url(redis_url).llen("kf.q") == 1


def test_without_the_fix_kombu_raises_attribute_error(redis_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect the fix is for, so the test above cannot pass for another reason (kombu fixed it:
    then this test fails, and the fix can go)."""
    from kombu.transport import redis as kombu_redis

    original = getattr(kombu_redis.Channel._connparams, "__wrapped__", kombu_redis.Channel._connparams)
    monkeypatch.setattr(kombu_redis.Channel, "_connparams", original)
    conn, message = _ack_on_a_closed_connection(redis_url, "kf.r")
    with pytest.raises(AttributeError):
        message.ack_log_error(logging.getLogger("celery.worker"), conn.connection_errors)
