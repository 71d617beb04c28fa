"""Redis Cluster URLs and the cluster script caller, on a real 3-master cluster.

The caller must keep the plain caller's rule there: a script whose reply was lost is never run again,
and every refusal the cluster answers before running a script (MOVED, ASK, NOSCRIPT) is followed.
"""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from celery_ha.base.errors import ConfigurationError
from celery_ha.redisio.client import is_redis_url, redis_client
from celery_ha.redisio.cluster import is_cluster_url, parse_cluster_url
from celery_ha.redisio.replicas import ReplicaWait
from celery_ha.redisio.scripts import LuaScript
from celery_ha.state import TaskQueue
from tests.support.redis_cluster import RedisClusterGroup, begin_migration, finish_migration, move_slot

COUNT = "return redis.call('INCR', KEYS[1])"
# Counts its runs, then keeps the node busy for ~300 ms (longer than the client's socket timeout below).
SLOW_INCR = """
redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > 300000
return 1
"""


# ---------------------------------------------------------------- URLs (no server needed)
def test_cluster_urls_are_parsed_with_every_seed_and_credential() -> None:
    target = parse_cluster_url("rediss+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2,[::1]:7002/0"
                               "?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required")
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert (target.username, target.password, target.ssl) == ("app", "s@cret", True)
    assert target.connection_options() == {"username": "app", "password": "s@cret", "ssl": True,
                                           "ssl_ca_certs": "/etc/ca.pem", "ssl_cert_reqs": "required"}
    assert parse_cluster_url("redis+cluster://:pw@h:1").password == "pw"
    assert parse_cluster_url("redis+cluster://token@h:1").password == "token"
    assert is_cluster_url("REDIS+CLUSTER://h:1") and is_redis_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1")


@pytest.mark.parametrize(("url", "why"), [
    ("redis+cluster://:secret@h:1/2", "only database 0"),
    ("redis+cluster://:secret@h:99999", "bad port"),
    ("redis+cluster://:secret@", "no node named"),
    ("redis+cluster://:secret@h:1?ssl_ca_certs=/x", "need rediss+cluster"),
    ("rediss+cluster://:secret@h:1?ssl_cert_reqs=maybe", "required, optional or none"),
    ("rediss+cluster://:secret@h:1?timeout=1", "unknown option"),
])
def test_a_bad_cluster_url_is_one_masked_line(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        redis_client(url)
    assert why in str(bad.value) and "secret" not in str(bad.value) and "\n" not in str(bad.value)


def test_an_unreachable_cluster_is_a_connection_error_without_the_password() -> None:
    with pytest.raises(redis.ConnectionError) as down:
        redis_client("redis+cluster://app:hunter2secret@127.0.0.1:1", socket_connect_timeout=0.5)
    assert "hunter2secret" not in str(down.value) and "app:***@" in str(down.value)


# ---------------------------------------------------------------- on the cluster
def test_a_cluster_url_gives_a_cluster_client_the_task_layer_runs_on(cluster_url: str) -> None:
    client = redis_client(cluster_url)
    assert isinstance(client, RedisCluster)
    q = TaskQueue(client, "cl")
    q.enqueue_many([f"https://example.com/{i}" for i in range(5)])
    lease = q.claim_next("w1")
    assert lease is not None
    assert q.commit(lease, [("k", {"v": 1})], checkpoint={"page": 2}) == 1
    q.complete(lease)
    stats = q.stats()
    assert (stats["queued"], stats["completed"], stats["items"]) == (4, 1, 1)


def test_noscript_on_the_node_is_recovered(cluster_url: str, redis_cluster: RedisClusterGroup) -> None:
    client = redis_client(cluster_url)
    script = LuaScript(client, COUNT)
    assert script(keys=["{ns}:n"]) == 1
    for n in range(len(redis_cluster.nodes)):
        redis_cluster.node_client(n).script_flush()
    assert script(keys=["{ns}:n"]) == 2


def test_a_script_is_refused_without_a_key_to_route_on(cluster_url: str) -> None:
    with pytest.raises(ValueError, match="at least one key"):
        LuaScript(redis_client(cluster_url), COUNT)(keys=[], args=[])


def test_moved_is_followed_and_the_new_owner_gets_the_script(cluster_url: str,
                                                              redis_cluster: RedisClusterGroup) -> None:
    """A resharding moves the namespace's slot: the caller follows MOVED, loads the script on the new
    master (NOSCRIPT) and runs it exactly once per call."""
    client = redis_client(cluster_url)
    script = LuaScript(client, COUNT)
    key = "{moved}:n"
    slot = client.keyslot(key)
    assert script(keys=[key]) == 1
    owner = _owner_index(redis_cluster, client, key)
    to = (owner + 1) % len(redis_cluster.nodes)
    move_slot(redis_cluster, slot, to)
    redis_cluster.node_client(to).script_flush()
    assert _owner_index(redis_cluster, client, key) == owner  # the client's map is stale now
    assert script(keys=[key]) == 2
    assert redis_cluster.node_client(to).get(key) == "2"


def test_ask_is_followed_during_a_migration(cluster_url: str, redis_cluster: RedisClusterGroup) -> None:
    client = redis_client(cluster_url)
    script = LuaScript(client, COUNT)
    key = "{asked}:n"
    slot = client.keyslot(key)
    to = (_owner_index(redis_cluster, client, key) + 1) % len(redis_cluster.nodes)
    source = begin_migration(redis_cluster, slot, to)
    try:
        assert script(keys=[key]) == 1  # the key is not on the source: ASK, then ASKING on the target
        assert redis_cluster.node_client(to).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1
    finally:
        finish_migration(redis_cluster, slot, source, to)
    assert script(keys=[key]) == 2


def test_a_lost_reply_is_never_answered_by_running_the_script_again(
        cluster_url: str, redis_cluster: RedisClusterGroup) -> None:
    client = redis_client(cluster_url, socket_timeout=0.05)
    script = LuaScript(client, SLOW_INCR)
    with pytest.raises(redis.TimeoutError):
        script(keys=["{lost}:runs"])
    checker = redis_cluster.client()
    assert checker.get("{lost}:runs") == "1"  # answered after the busy script: a re-send ran by now
    assert checker.ping()
    assert checker.get("{lost}:runs") == "1"


def test_a_killed_connection_is_replaced(cluster_url: str, redis_cluster: RedisClusterGroup) -> None:
    client = redis_client(cluster_url)
    script = LuaScript(client, COUNT)
    assert script(keys=["{killed}:n"]) == 1
    for n in range(len(redis_cluster.nodes)):
        redis_cluster.node_client(n).client_kill_filter(_type="normal", skipme=True)
    assert script(keys=["{killed}:n"]) == 2


def test_wait_travels_with_the_script_on_a_cluster(cluster_url: str) -> None:
    """No replicas: every WAIT returns 0 at its timeout; the script's reply is still the one returned."""
    wait = ReplicaWait(1, 10)
    script = LuaScript(redis_client(cluster_url), COUNT, wait=wait)
    assert [script(keys=["{wait}:n"]) for _ in range(3)] == [1, 2, 3]
    assert wait.short == 3


def _owner_index(group: RedisClusterGroup, client: RedisCluster, key: str) -> int:
    """The master the client's slot map names for ``key``."""
    node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
    return [n.port for n in group.nodes].index(node.port)
