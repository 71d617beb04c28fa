"""Python's side of where task records live (``_records.lua``): reads of records by id, their count,
and a walk over all of them.

Records sit in buckets ``t:<i>`` that split as the namespace grows (linear hashing), with the one
hash ``tasks`` of earlier releases read until its records are written again. Reads by id go through
``records.lua``, so the bucket geometry and the buckets are read at one instant.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import redis

from celery_ha.redisio.caller import LuaScript
from celery_ha.redisio.scripts import script_source
from celery_ha.state.keys import QueueKeys

_HERE = Path(__file__).parent
#: Ids per script call: a read of a page of a listing is one call; a longer one is cut.
READ_CHUNK = 1000
#: The attribute a client keeps its records reader in. On the client, not in a cache keyed by it: the
#: reader holds its client, so a cache entry would keep every short-lived client (a CLI call's, a
#: request's) and the connection it holds for the life of the process; as an attribute the two form
#: a cycle the collector frees with the client.
_READER = "_celery_ha_records_reader"


def _reader(client: redis.Redis) -> LuaScript:
    script = getattr(client, _READER, None)
    if script is None:
        script = LuaScript(client, script_source(str(_HERE), "records"))
        setattr(client, _READER, script)
    return script


def read_records(client: redis.Redis, keys: QueueKeys, ids: list[str]) -> list[str | None]:
    """The raw records of ``ids`` on one shard (None where there is none), in order."""
    out: list[str | None] = []
    for start in range(0, len(ids), READ_CHUNK):
        chunk = ids[start:start + READ_CHUNK]
        raws = _reader(client)(keys=[keys.tasks], args=[keys.prefix, *chunk])
        out += [raw.decode() if isinstance(raw, bytes) else raw for raw in raws]
    return out


def read_record(client: redis.Redis, keys: QueueKeys, task_id: str) -> str | None:
    """The raw record of one task (None when there is none)."""
    return read_records(client, keys, [task_id])[0]


def record_count(client: redis.Redis, keys: QueueKeys) -> int:
    """How many records the shard holds (buckets and the hash of earlier releases)."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.record_geometry, "n")
    pipe.hlen(keys.tasks)
    in_buckets, legacy = pipe.execute()
    return int(in_buckets or 0) + int(legacy or 0)


def bucket_count(client: redis.Redis, keys: QueueKeys) -> int:
    """How many buckets the geometry spans (some may be empty: no key)."""
    level, split = client.hmget(keys.record_geometry, ["l", "s"])
    return 2 ** int(level or 0) + int(split or 0)


def all_records(client: redis.Redis, keys: QueueKeys) -> Iterator[tuple[str, str]]:
    """Every (id, raw record) of the shard, bucket by bucket, then the hash of earlier releases.
    Not a snapshot: a record written meanwhile may be seen twice or not at all (for checks of a
    quiet namespace, and walks that tolerate it)."""
    for i in range(bucket_count(client, keys)):
        yield from client.hscan_iter(keys.record_bucket(i), count=500)
    yield from client.hscan_iter(keys.tasks, count=500)
