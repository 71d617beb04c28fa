"""Redis key names of the durable task layer.

All keys of one namespace share the hash tag ``{ns}``, so a namespace lives in one Redis Cluster slot and
every multi-key Lua script stays legal there. A sharded namespace (``CELERY_HA_SHARDS``, see
``state/shards.py``) has one such tag per shard; each script still touches one shard, so one slot.
Names are short on purpose: they are repeated per task.
"""

from __future__ import annotations


def prefix(namespace: str, tag: str | None = None) -> str:
    """The common prefix of every key of ``namespace``: ``cha:{namespace}:`` (or, for one shard of a
    sharded namespace, ``cha:{<shard tag>}:``; see ``celery_ha.state.shards``)."""
    return f"cha:{{{tag or namespace}}}:"


class QueueKeys:
    """Keys of the durable task layer (see README "Data layout").

    With ``tag`` (a shard of a sharded namespace) the per-task keys live under that shard's tag; the
    namespace-wide ones (locks, worker registry, task names, meta) always stay under the namespace's.
    """

    def __init__(self, namespace: str, tag: str | None = None) -> None:
        p = prefix(namespace, tag)
        base = prefix(namespace)
        self.prefix = p
        # Task records (_records.lua, state/record_store.py): hashes t:<i> (id -> record), a bucket
        # count that grows by linear hashing (geometry: hash tg), and the one hash of earlier
        # releases, read until its records are written again
        self.tasks = p + "tasks"
        self.record_geometry = p + "tg"
        self.ready_bands = p + "readyp"  # zset: priority bands holding queued tasks, score = -priority
        self.delayed = p + "delayed"  # zset: id, score = due time (ms, Redis clock)
        self.inflight = p + "inflight"  # zset: id, score = dispatch time (ms)
        self.running = p + "running"  # zset: id, score = lease expiry (ms)
        self.dead = p + "dead"  # zset: id, score = time of death (µs, orders deaths within a ms)
        self.completed = p + "completed"  # zset: id, score = completion time (bounded history)
        # zset: dedup ids of finished tasks -> completion time (ms), the layout before the buckets
        # d:<3 chars> of _remembered.lua (state/done_times.py); read until the sweep moved it
        self.done = p + "done"
        self.legacy_seen = p + "seen"  # set: 0.1 releases' dedup ids (no times); the sweep moves them
        self.checkpoints = p + "ckpt"  # hash: id -> JSON checkpoint
        self.stats = p + "stats"  # hash: counters
        self.hist = p + "hist"  # hash: wait/runtime histogram buckets, "<w|r>:<bucket>:<task>" -> count
        self.wake = p + "wake"  # list: wake-up tokens for blocked claim_next callers
        self.items = p + "items"  # hash: item key -> JSON item (the Redis sink)
        self.item_log = p + "itemlog"  # list: item keys in commit order (for export)
        self.locks = base + "lock:"  # prefix of short maintenance locks
        self.workers = base + "workers"  # zset: worker name -> last heartbeat (ms)
        self.task_names = base + "tasknames"  # hash: worker node -> JSON list of the task names it runs
        self.node_info = base + "nodes"  # hash: worker node -> JSON of its start-up report (patches)
        self.meta = base + "meta"  # hash: last sweep time, pause flag, shard count, other bookkeeping
        # The host gate (state/hosts.py, _hosts.lua), per shard: a host's keys live on its shard.
        self.host_config = p + "hcfg"  # hash: defaults, gate switch, counters (nq: tasks in host queues)
        self.hosts_ready = p + "hready"  # zset: eligible hosts with queued tasks
        self.hosts_wait = p + "hwait"  # zset: other hosts with queued tasks, score = when eligible (ms)
        self.hosts = p + "hosts"  # set: every host the gate knows
        # Conditional requests (state/validators.py): id -> ETag / Last-Modified of its page, bounded
        self.validators = p + "valid"
        # Refetch schedules (state/schedules.py, _refetch.lua), per shard
        self.schedules = p + "sched"  # hash: 't:<task>', 'h:<host>', 't:<task>@<host>' -> schedule
        # zset: the refetch index, record bucket index -> a lower bound of the due times (ms) of the
        # bucket's records that wait for a scheduled run (_refetch.lua)
        self.refetch_buckets = p + "rfb"
        # zset: the index of earlier releases (waiting ids, score = due ms), read until drained
        self.refetch = p + "refetch"

    def record_bucket(self, index: int) -> str:
        """Hash of record bucket ``index`` (must match rec_key() in _records.lua)."""
        return f"{self.prefix}t:{index}"

    def ready_list(self, priority: int | str) -> str:
        """List of queued ids of one priority band, FIFO (must match ready_key() in _common.lua)."""
        return f"{self.prefix}r:{priority}"

    def host_queue(self, host: str) -> str:
        """Zset of one host's queued ids as an earlier release kept them, read until it is drained
        (must match hqkey() in _hosts.lua)."""
        return f"{self.prefix}hq:{host}"

    def host_bands(self, host: str) -> str:
        """Zset of the bands (1000 - priority) one host has queued ids in (hbkey() in _hosts.lua)."""
        return f"{self.prefix}hb:{host}"

    def host_list(self, band: int | str, host: str) -> str:
        """List of one host's queued ids of one band, oldest first (hlkey() in _hosts.lua)."""
        return f"{self.prefix}hl:{band}:{host}"

    def host_state(self, host: str) -> str:
        """Hash of one host's limits and state (must match hkey() in _hosts.lua)."""
        return f"{self.prefix}h:{host}"

    def lock(self, name: str) -> str:
        return self.locks + name
