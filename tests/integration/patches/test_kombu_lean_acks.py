"""A durable task's message leaves no copy in kombu's ``unacked`` hash; every other message keeps
kombu's ack emulation; a lean message still goes back to its list on a requeue and when its channel
closes unacknowledged. Real kombu on a real Redis: what is asserted is what the broker holds and
which commands it ran (``INFO commandstats``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

from celery_ha.integration.patches import kombu_lean_acks, registry

DURABLE, PLAIN = "crawl.fetch", "user.report"
QUEUE = "lean.q"


@pytest.fixture
def lean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The patch on for the test, with DURABLE as the one durable task; kombu as it was afterwards."""
    for method in ("append", "ack", "reject", "restore_by_tag"):
        current = getattr(kombu_redis.QoS, method)
        monkeypatch.setattr(kombu_redis.QoS, method, getattr(current, "__wrapped__", current))
    monkeypatch.setattr(registry, "_statuses", {})
    assert kombu_lean_acks.install({DURABLE}.__contains__)
    assert kombu_lean_acks.install({DURABLE}.__contains__)  # idempotent: the app built twice
    yield
    for method in ("append", "ack", "reject", "restore_by_tag"):  # undone by monkeypatch; the predicate too
        assert hasattr(getattr(kombu_redis.QoS, method), "__wrapped__")
    monkeypatch.setattr(kombu_lean_acks, "_durable", kombu_lean_acks._no_durable_tasks)


def _publish(url: str, *tasks: str) -> None:
    with Connection(url) as conn, conn.Producer() as producer:
        for i, task in enumerate(tasks):
            producer.publish([f"T{i}"], routing_key=QUEUE, serializer="json",
                             declare=[Queue(QUEUE, routing_key=QUEUE)], headers={"task": task, "id": f"T{i}"})


def _get(conn: Connection) -> Any:
    message = Queue(QUEUE, routing_key=QUEUE)(conn.default_channel).get(no_ack=False)
    assert message is not None
    return message


def _calls(r: redis.Redis, *commands: str) -> dict[str, int]:
    stats = r.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands}


def _listed(r: redis.Redis) -> list[tuple[str, str, bool]]:
    """(task, id, redelivered) of every message on the queue's list, next to be taken first."""
    out = []
    for raw in reversed(r.lrange(QUEUE, 0, -1)):
        m = json.loads(raw)
        out.append((m["headers"]["task"], m["headers"]["id"], bool(m["headers"].get("redelivered"))))
    return out


def test_a_durable_message_is_taken_and_acked_without_the_unacked_hash(redis_url: str, r: redis.Redis,
                                                                        lean: None) -> None:
    _publish(redis_url, DURABLE, DURABLE, DURABLE)
    before = _calls(r, "hset", "zadd", "hdel", "zrem", "multi", "exec")
    with Connection(redis_url) as conn:
        messages = [_get(conn) for _ in range(3)]
        assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
        for message in messages:
            message.ack()
        assert r.llen(QUEUE) == 0 and r.hlen("unacked") == 0
        assert not conn.default_channel.qos._delivered or all(
            tag in conn.default_channel.qos._dirty for tag in conn.default_channel.qos._delivered)
    # Nothing was written to or removed from the unacked hash and its index, in no transaction.
    assert _calls(r, "hset", "zadd", "hdel", "zrem", "multi", "exec") == before
    assert r.llen(QUEUE) == 0  # and closing the channel restored none of the acked messages


def test_any_other_message_keeps_the_ack_emulation(redis_url: str, r: redis.Redis, lean: None) -> None:
    _publish(redis_url, PLAIN, DURABLE)
    with Connection(redis_url) as conn:
        plain, durable = _get(conn), _get(conn)
        assert plain.headers["task"] == PLAIN and durable.headers["task"] == DURABLE
        (copy,) = r.hvals("unacked")  # only the plain task's message is copied
        assert json.loads(copy)[0]["headers"]["task"] == PLAIN and r.zcard("unacked_index") == 1
        plain.ack()
        assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
        durable.ack()
    assert r.llen(QUEUE) == 0


def test_a_requeued_durable_message_goes_back_to_its_list_whole(redis_url: str, r: redis.Redis,
                                                                 lean: None) -> None:
    _publish(redis_url, DURABLE, DURABLE)
    with Connection(redis_url) as conn:
        first, second = _get(conn), _get(conn)
        first.reject(requeue=True)
        second.reject(requeue=False)  # dropped: the durable layer re-sends what nobody claims
        assert _listed(r) == [(DURABLE, "T0", True)]
        again = _get(conn)
        assert again.headers["id"] == "T0" and again.payload == ["T0"]
        again.ack()
    assert r.llen(QUEUE) == 0 and r.hlen("unacked") == 0


def test_a_channel_closed_with_durable_messages_unacked_restores_them(redis_url: str, r: redis.Redis,
                                                                      lean: None) -> None:
    """A warm shutdown or a lost connection: kombu restores what the consumer held; the lean ones
    come back from memory, the plain one from the unacked hash, each once; the acked one not at all."""
    _publish(redis_url, DURABLE, PLAIN, DURABLE)
    conn = Connection(redis_url)
    held = [_get(conn) for _ in range(3)]
    held[2].ack()
    conn.release()  # closes the channel: kombu's restore of unacknowledged messages
    assert sorted(_listed(r)) == [(DURABLE, "T0", True), (PLAIN, "T1", True)]
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0


def test_prefetch_still_counts_durable_messages(redis_url: str, lean: None) -> None:
    _publish(redis_url, DURABLE, DURABLE)
    with Connection(redis_url) as conn:
        channel = conn.default_channel
        channel.basic_qos(prefetch_count=1)
        message = _get(conn)
        assert not channel.qos.can_consume()
        message.ack()
        assert channel.qos.can_consume()


def test_off_when_kombus_qos_changes_shape(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(registry, "_statuses", {})

    def append(self: object, message: object) -> None:  # a kombu whose append lost its tag
        pass

    monkeypatch.setattr(kombu_redis.QoS, "append", append)
    with caplog.at_level(logging.WARNING):
        assert kombu_lean_acks.install({DURABLE}.__contains__) is False
        assert kombu_lean_acks.install({DURABLE}.__contains__) is False
    assert kombu_redis.QoS.append is append
    (warning,) = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert "kombu_lean_acks is off" in warning and "unacked hash" in warning
    assert "QoS.append" in warning
