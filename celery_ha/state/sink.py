"""The output sink: items keyed for exactly-once storage, read back in commit order.

Writing happens through ``TaskQueue.commit`` (items and the checkpoint in one fenced Lua script; a
key the sink already holds is ignored). This module computes item keys and reads the sink back for
export (``celery-ha export``) and tests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from celery_ha.base.errors import InvalidInput
from celery_ha.state.shards import namespace_keys


def item_key(item: Mapping[str, Any], field: str | None = None) -> str:
    """The sink key of ``item``: the value of ``field`` when named, else a stable content hash.

    The hash is SHA-256 over canonical JSON (sorted keys, compact), so the same item emitted again
    after a crash gets the same key and is stored once.
    """
    if field is not None:
        if field not in item or item[field] in (None, ""):
            raise InvalidInput(f"item has no {field!r} field to key it by")
        return str(item[field])
    blob = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "h:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:40]


def count_items(client: redis.Redis, namespace: str = "default") -> int:
    """How many distinct items the sink holds (every shard's)."""
    return sum(int(client.hlen(k.items)) for k in namespace_keys(client, namespace))


def iter_items(client: redis.Redis, namespace: str = "default", batch: int = 500,
               with_keys: bool = False) -> Iterator[Any]:
    """Yield stored items in commit order (dicts, or ``(key, item)`` with ``with_keys``).

    Reads the commit log in batches, so exporting millions of items never loads them all at once.
    A sharded namespace is read shard after shard (commit order within each shard).
    """
    for keys in namespace_keys(client, namespace):
        start = 0
        while True:
            chunk = client.lrange(keys.item_log, start, start + batch - 1)
            if not chunk:
                break
            for key, raw in zip(chunk, client.hmget(keys.items, chunk), strict=True):
                if raw is None:
                    continue
                item = json.loads(raw)
                yield (key, item) if with_keys else item
            start += len(chunk)
