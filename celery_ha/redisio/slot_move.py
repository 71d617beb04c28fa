"""Move one Redis Cluster slot, with its keys, to another master: how a sharded namespace grows.

Each shard of a namespace is one hash tag, so one slot (``state/shards.py``). A cluster grows by
adding a master and moving slots onto it; ``redis-cli --cluster reshard`` moves a number of slots it
chooses, so moving the slot of one given shard takes the steps it runs underneath, done here:
``CLUSTER SETSLOT <slot> IMPORTING`` on the target, ``MIGRATING`` on the source, ``MIGRATE`` of the
slot's keys in batches, then ``SETSLOT <slot> NODE <target>`` on the target, the source and every
other master. The steps are idempotent: a move that stopped half-way (a node away, a timeout) is
finished by running it again, which picks up the keys still on the source.

This is an offline operation for celery-ha: while a slot migrates, a script whose declared keys are
all on the source still runs there, and a key it builds from its prefix (a record bucket, a band)
that is absent reads as "no such key" and makes the script fail half-way. So nothing may run
scripts on the slot meanwhile: the caller checks that the namespace's processes are stopped
(``celery-ha shards move`` refuses otherwise).

Beside redis-py's public cluster API this reads its ``nodes_manager``'s ``connection_kwargs`` (the
credentials MIGRATE passes on) and registers a master that serves no slot yet in its node cache
(``nodes_cache``, ``create_redis_connections``): present in every redis-py release pyproject.toml
allows (the CI runs its floor and its newest).
"""

from __future__ import annotations

from collections.abc import Callable

from redis.cluster import ClusterNode, RedisCluster

from celery_ha.base.errors import ConfigurationError

#: Keys per MIGRATE call, and the milliseconds one call may wait for the target.
BATCH = 1000
MIGRATE_TIMEOUT_MS = 60_000


def master_at(client: RedisCluster, address: str) -> ClusterNode:
    """The master of the cluster at ``host:port``: one of the slot map, or one that serves no slot
    yet (just added: it is only in ``CLUSTER NODES``)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigurationError(f"a master is HOST:PORT, got {address!r}")
    node = client.get_node(host=host, port=int(port))
    if node is not None and node.server_type == "primary":
        return node
    # A master without slots yet (just added) is in CLUSTER NODES, not in the slot map.
    for line in str(_text(client.get_redis_connection(client.get_primaries()[0])
                          .execute_command("CLUSTER", "NODES"))).splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1].split("@")[0] == f"{host}:{port}" and "master" in fields[2]:
            node = ClusterNode(host, int(port), server_type="primary")
            client.nodes_manager.nodes_cache[node.name] = node
            client.nodes_manager.create_redis_connections([node])
            return node
    masters = ", ".join(sorted(f"{n.host}:{n.port}" for n in client.get_primaries()))
    raise ConfigurationError(f"{address} is not a master of this cluster (masters: {masters}); add it "
                             "first: redis-cli --cluster add-node NEW_HOST:PORT ANY_NODE:PORT")


def keys_of_slot(client: RedisCluster, slot: int) -> list[str]:
    """The names of every key ``slot`` holds on its master."""
    node = client.nodes_manager.get_node_from_slot(slot)
    conn = client.get_redis_connection(node)
    count = int(conn.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    names = conn.execute_command("CLUSTER", "GETKEYSINSLOT", slot, max(count, 1)) if count else []
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def move_slot(client: RedisCluster, slot: int, to: ClusterNode,
              progress: Callable[[int], None] | None = None) -> int:
    """Move ``slot`` and its keys to master ``to``; returns how many keys moved (0 when the slot is
    there already). ``progress`` is called with the running count after each batch."""
    source = client.nodes_manager.get_node_from_slot(slot)
    if (source.host, source.port) == (to.host, to.port):
        return 0
    src, dst = client.get_redis_connection(source), client.get_redis_connection(to)
    state = dst.execute_command("CLUSTER", "INFO")
    state = state if isinstance(state, dict) else dict(
        line.split(":", 1) for line in _text(state).splitlines() if ":" in line)
    if str(state.get("cluster_state", "")).strip() != "ok":
        raise ConfigurationError(f"the master at {to.host}:{to.port} does not see the cluster ok yet "
                                 "(cluster_state is not ok): wait until it has joined, then run this again")
    src_id, dst_id = _myid(src), _myid(dst)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    auth = _migrate_auth(client)
    moved = 0
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, BATCH):
        src.execute_command("MIGRATE", to.host, to.port, "", 0, MIGRATE_TIMEOUT_MS, *auth, "KEYS", *keys)
        moved += len(keys)
        if progress is not None:
            progress(moved)
    # The target first: from then on it serves the slot, whatever the others still say.
    others = [n for n in client.get_primaries() if (n.host, n.port) not in {(to.host, to.port),
                                                                            (source.host, source.port)}]
    for node in (to, source, *others):
        client.get_redis_connection(node).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    client.nodes_manager.initialize()
    return moved


def _myid(conn: object) -> str:
    return _text(conn.execute_command("CLUSTER", "MYID"))  # type: ignore[attr-defined]


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _migrate_auth(client: RedisCluster) -> list[str]:
    """MIGRATE's own AUTH / AUTH2 arguments: the target asks the source for the same credentials."""
    options = client.nodes_manager.connection_kwargs
    user, password = options.get("username"), options.get("password")
    if password and user:
        return ["AUTH2", str(user), str(password)]
    return ["AUTH", str(password)] if password else []
