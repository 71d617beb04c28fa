"""A master of the cluster dies and its replica takes over: the script caller follows it.

A cluster of its own (3 masters, one replica for the first), so the session cluster keeps its
layout. Calls while the master is gone fail (the task layer treats that as an outage); none of them
ran, and the first call that succeeds runs once on the promoted replica, which never saw the script
(scripts are not replicated): NOSCRIPT, loaded there, run.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.redisio.client import redis_client
from celery_ha.redisio.scripts import LuaScript
from celery_ha.state import TaskQueue
from tests.support.polling import wait_until
from tests.support.redis_cluster import RedisClusterGroup, cluster_binaries

pytestmark = pytest.mark.slow

COUNT = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
def failover_cluster(tmp_path: Path) -> Iterator[RedisClusterGroup]:
    binaries = cluster_binaries()
    if binaries is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli >= 7 (/usr/bin or PATH)")
    group = RedisClusterGroup(tmp_path, *binaries, node_timeout_ms=500)
    try:
        group.start()
        group.add_replica(0)
        yield group
    finally:
        group.stop()


def _key_on(client, port: int, prefix: str) -> str:
    return next(f"{{{prefix}{i}}}:n" for i in range(10_000)
                if client.nodes_manager.get_node_from_slot(client.keyslot(f"{{{prefix}{i}}}:n")).port == port)


def test_a_failover_is_followed_and_nothing_runs_twice(failover_cluster: RedisClusterGroup) -> None:
    group = failover_cluster
    client = redis_client(group.url, socket_timeout=1, socket_connect_timeout=1)
    key = _key_on(client, group.nodes[0].port, "fo")
    script = LuaScript(client, COUNT)
    assert script(keys=[key]) == 1
    q = TaskQueue(client, _key_on(client, group.nodes[0].port, "ns").split("}")[0][1:])
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w")
    assert lease is not None
    master = group.node_client(0)
    replica = redis.Redis(host="127.0.0.1", port=group.replicas[0].port, decode_responses=True)
    # The replica holds both writes. WAIT on this connection would not say so: it waits only for the
    # writes of the connection that sends it, and this one wrote nothing (under load the replica lagged
    # and the promoted replica counted from 0). So compare the replication offsets.
    written = int(master.info("replication")["master_repl_offset"])
    wait_until(lambda: int(replica.info("replication")["slave_repl_offset"]) >= written, 10,
               what="the replica to hold the master's writes")
    assert replica.script_exists(script.sha) == [False]

    assert group.nodes[0].proc is not None
    group.nodes[0].proc.send_signal(signal.SIGKILL)
    group.nodes[0].proc.wait(timeout=10)
    failures: list[str] = []

    def call() -> int | None:
        try:
            return int(script(keys=[key]))
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterDownError) as exc:
            failures.append(f"{type(exc).__name__}: {exc} (replica: {replica.info('replication')['role']})")
            return None

    try:
        ran = wait_until(call, timeout=30, interval=0.2, what="the script to run on the promoted replica")
    except AssertionError:
        raise AssertionError(failures[-3:]) from None
    assert ran == 2 and failures and replica.get(key) == "2"  # none of the failed calls ran
    assert replica.info("replication")["role"] == "master"
    q.complete(lease)  # the lease survived the failover: the fenced completion runs on the new master
    assert q.stats()["completed"] == 1
